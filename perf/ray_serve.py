"""`python -m perf ray`: attnserve behind Ray Serve's proxies, on this machine.

1. One request at a time: Encode over gRPC and /v1/embeddings over HTTP, at T = 8, 128,
   512, from `attnserve serve` directly and from a Ray Serve replica behind Ray's proxies,
   with the same settings (one ORT thread, no extra instances), in alternating blocks.
2. Two replicas against one: a closed loop of 8 gRPC clients (64 tokens, embeddings) on
   the application with one replica, then with two (one CPU each). The two replicas share
   this machine's two cores with the proxy and the clients: reported, not promised.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from attnserve.bench.results import save
from attnserve.bench.timing import alternate, p50_ms
from attnserve.client import EncoderClient
from attnserve.service.process import spawn_server

LENGTHS = (8, 128, 512)
SETTINGS = {"provider": "cpu", "threads": 1, "instances": 1}
CLIENTS = 8
LOAD_LENGTH = 64


def start_ray(model_dir: Path, replicas: int, http_port: int, grpc_port: int) -> None:
    import ray
    from ray import serve
    from ray.serve.config import HTTPOptions, gRPCOptions

    from attnserve.service.ray.app import GRPC_SERVICERS, Encoder, actor_options

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        serve.start(
            http_options=HTTPOptions(host="127.0.0.1", port=http_port),
            grpc_options=gRPCOptions(port=grpc_port, grpc_servicer_functions=GRPC_SERVICERS),
        )
    app = Encoder.options(num_replicas=replicas, ray_actor_options=actor_options())
    serve.run(app.bind(model=str(model_dir), **SETTINGS), name="attnserve", route_prefix="/")


def one_at_a_time(model_dir: Path, ray_ports: dict, blocks: int, log: Callable) -> list[dict]:
    flags = ["--provider", "cpu", "--threads", "1", "--instances", "1"]
    direct = spawn_server(model_dir, *flags)
    rows = []
    try:
        with (
            EncoderClient(direct.address) as d,
            EncoderClient(f"127.0.0.1:{ray_ports['grpc']}") as r,
            httpx.Client(timeout=60) as http,
        ):
            urls = {
                "direct": f"http://127.0.0.1:{direct.http_port}/v1/embeddings",
                "ray": f"http://127.0.0.1:{ray_ports['http']}/v1/embeddings",
            }
            for t in LENGTHS:
                ids = np.random.default_rng(t).integers(3, 256, size=t).tolist()
                log(f"  ray: direct vs Ray's proxies, T={t}")

                def post(which: str, ids=ids) -> None:
                    http.post(urls[which], json={"input": [ids]}).raise_for_status()

                samples, _ = alternate(
                    {
                        "direct gRPC": lambda ids=ids: d.encode(ids),
                        "Ray gRPC": lambda ids=ids: r.encode(ids),
                        "direct HTTP": lambda: post("direct"),
                        "Ray HTTP": lambda: post("ray"),
                    },
                    least=10 * blocks,
                    most=40 * blocks,
                    seconds=1.5 * blocks,
                )
                p = {name: p50_ms(s) for name, s in samples.items()}
                rows.append(
                    {
                        "seq_len": t,
                        **{name.replace(" ", "_").lower() + "_ms": v for name, v in p.items()},
                        "grpc_ratio": p["Ray gRPC"] / p["direct gRPC"],
                        "http_ratio": p["Ray HTTP"] / p["direct HTTP"],
                    }
                )
    finally:
        direct.process.terminate()
        direct.process.wait(30)
    return rows


def closed_loop(address: str, seconds: float) -> dict:
    latencies: list[float] = []
    errors = 0
    stop = threading.Event()
    ids = list(range(3, 3 + LOAD_LENGTH))

    def client() -> None:
        nonlocal errors
        with EncoderClient(address) as c:
            while not stop.is_set():
                start = time.perf_counter()
                try:
                    c.encode(ids, token_embeddings=False, pooling="last")
                except Exception:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join(60)
    elapsed = time.perf_counter() - start
    ms = sorted(x * 1e3 for x in latencies)
    return {
        "requests_per_s": len(ms) / elapsed,
        "p50_ms": statistics.median(ms),
        "p99_ms": ms[int(0.99 * (len(ms) - 1))],
        "errors": errors,
    }


def run_ray(out: Path, model_dir: Path, blocks: int = 3, seconds: float = 15.0, log=print) -> dict:
    import socket

    import ray
    from ray import serve

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    ports = {"http": free_port(), "grpc": free_port()}
    try:
        start_ray(model_dir, 1, ports["http"], ports["grpc"])
        rows = one_at_a_time(model_dir, ports, blocks, log)
        scaling = {}
        for replicas in (1, 2):
            start_ray(model_dir, replicas, ports["http"], ports["grpc"])
            log(f"  ray: closed loop of {CLIENTS} clients on {replicas} replica(s)")
            scaling[replicas] = closed_loop(f"127.0.0.1:{ports['grpc']}", seconds)
    finally:
        serve.shutdown()
        ray.shutdown()
    result = {"ray": ray.__version__, "rows": rows, "replicas": scaling}
    save(out, "ray", result, table(result))
    return result


def table(result: dict) -> str:
    lines = [
        f"Ray {result['ray']}, one replica (1 CPU, one ORT thread) against `attnserve serve` "
        "with the same settings, p50 one request at a time:",
        "",
        "| T | direct gRPC | Ray gRPC | ratio | direct HTTP | Ray HTTP | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['seq_len']} | {r['direct_grpc_ms']:.2f} ms | {r['ray_grpc_ms']:.2f} ms "
            f"| {r['grpc_ratio']:.2f}x | {r['direct_http_ms']:.2f} ms | {r['ray_http_ms']:.2f} ms "
            f"| {r['http_ratio']:.2f}x |"
        )
    lines += [
        "",
        f"Closed loop of {CLIENTS} gRPC clients ({LOAD_LENGTH} tokens, pooled) on one machine "
        "of 2 cores:",
        "",
        "| replicas | req/s | p50 | p99 | errors |",
        "|---|---|---|---|---|",
    ]
    for n, v in result["replicas"].items():
        lines.append(
            f"| {n} | {v['requests_per_s']:.0f} | {v['p50_ms']:.1f} ms | {v['p99_ms']:.1f} ms "
            f"| {v['errors']} |"
        )
    return "\n".join(lines)
