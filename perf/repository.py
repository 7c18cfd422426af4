"""`python -m perf repository`: what serving several models, and reloading one, costs.

1. A second model costs the first nothing: Encode p50 on model `default` at T = 8, 128, 512
   (batch 1, every attention weight), from a server of a repository holding only `default`
   and from one holding `default` and `second` (another copy, loaded, idle), the two servers
   up side by side and timed in alternating blocks.
2. A reload under load: a closed loop of 8 client threads on `default`, once without a
   reload and once while version 2 is loaded (RepositoryModelLoad, the same weights), on one
   server; p50/p99/max and failed requests of each, and how long the reload took.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np

from attnserve.bench.results import save
from attnserve.bench.timing import alternate, p50_ms
from attnserve.client import ClientOptions, EncoderClient
from attnserve.oip import grpc_service_pb2 as oip
from attnserve.oip import grpc_service_pb2_grpc as oip_grpc
from attnserve.service.process import ServerProcess, spawn_server

LENGTHS = (8, 128, 512)
CLIENTS = 8
RELOAD_LENGTH = 32


def repository(root: Path, model_dir: Path, names: tuple[str, ...]) -> Path:
    for name in names:
        shutil.copytree(model_dir, root / name / "1")
    return root


def serve(root: Path) -> ServerProcess:
    flags = ("--model-repository", str(root), "--default-model", "default", "--provider", "cpu")
    return spawn_server(None, *flags)


def second_model_cost(model_dir: Path, scratch: Path, blocks: int, log: Callable) -> list[dict]:
    one = serve(repository(scratch / "one", model_dir, ("default",)))
    two = serve(repository(scratch / "two", model_dir, ("default", "second")))
    rows = []
    try:
        with EncoderClient(one.address) as a, EncoderClient(two.address) as b:
            for t in LENGTHS:
                ids = np.random.default_rng(t).integers(3, 256, size=t).tolist()
                log(f"  repository: one vs two models loaded, T={t}")
                samples, _ = alternate(
                    {
                        "one model": lambda ids=ids: a.encode(ids, attention=True),
                        "two models": lambda ids=ids: b.encode(ids, attention=True),
                    },
                    least=10 * blocks,
                    most=40 * blocks,
                    seconds=2.0 * blocks,
                )
                p1, p2 = p50_ms(samples["one model"]), p50_ms(samples["two models"])
                rows.append({"seq_len": t, "one_ms": p1, "two_ms": p2, "ratio": p2 / p1})
    finally:
        for server in (one, two):
            server.process.terminate()
            server.process.wait(30)
    return rows


def closed_loop(address: str, seconds: float, during: Callable[[], float] | None) -> dict:
    """8 threads sending Encode on `default` back to back for `seconds`; `during` runs in the
    middle (after a third of the time) and returns how long it took."""
    latencies: list[float] = []
    failures: list[str] = []
    stop = threading.Event()
    ids = list(range(3, 3 + RELOAD_LENGTH))

    def client() -> None:
        with EncoderClient(address, ClientOptions(timeout_s=60, retries=0)) as c:
            while not stop.is_set():
                start = time.perf_counter()
                try:
                    c.encode(ids, model="default")
                except grpc.RpcError as exc:
                    failures.append(exc.code().name)
                    continue
                latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    time.sleep(seconds / 3)
    took = during() if during else None
    time.sleep(seconds * 2 / 3)
    stop.set()
    for thread in threads:
        thread.join(60)
    ms = sorted(x * 1e3 for x in latencies)
    return {
        "requests": len(ms),
        "failed": len(failures),
        "p50_ms": statistics.median(ms),
        "p99_ms": ms[int(0.99 * (len(ms) - 1))],
        "max_ms": ms[-1],
        "reload_s": took,
    }


def reload_under_load(model_dir: Path, scratch: Path, seconds: float, log: Callable) -> dict:
    root = repository(scratch / "reload", model_dir, ("default",))
    server = serve(root)
    channel = grpc.insecure_channel(server.address)
    stub = oip_grpc.GRPCInferenceServiceStub(channel)

    def reload() -> float:
        shutil.copytree(model_dir, root / "default" / "2")
        start = time.perf_counter()
        stub.RepositoryModelLoad(oip.RepositoryModelLoadRequest(model_name="default"))
        return time.perf_counter() - start

    try:
        log(f"  repository: closed loop of {CLIENTS} clients, {seconds:.0f} s without a reload")
        steady = closed_loop(server.address, seconds, None)
        log(f"  repository: closed loop of {CLIENTS} clients, {seconds:.0f} s with a reload")
        reloading = closed_loop(server.address, seconds, reload)
    finally:
        channel.close()
        server.process.terminate()
        server.process.wait(30)
    return {"without": steady, "with": reloading}


def run_repository(
    out: Path, model_dir: Path, blocks: int = 3, seconds: float = 15.0, log: Callable = print
) -> dict:
    with tempfile.TemporaryDirectory(prefix="attnserve-repository-") as scratch:
        rows = second_model_cost(model_dir, Path(scratch), blocks, log)
        reload = reload_under_load(model_dir, Path(scratch), seconds, log)
    result = {"model": str(model_dir), "second_model": rows, "reload": reload}
    save(out, "repository", result, table(result))
    return result


def table(result: dict) -> str:
    lines = [
        "Encode p50 on model `default` (batch 1, every attention weight), one vs two models "
        "loaded:",
        "",
        "| T | one model | two models | two / one |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['seq_len']} | {r['one_ms']:.2f} ms | {r['two_ms']:.2f} ms | {r['ratio']:.2f}x |"
        for r in result["second_model"]
    ]
    w, r = result["reload"]["without"], result["reload"]["with"]
    lines += [
        "",
        f"Closed loop, {CLIENTS} clients, Encode of {RELOAD_LENGTH} tokens on `default`, "
        f"without and during a reload to version 2 (the reload took {r['reload_s']:.1f} s):",
        "",
        "| | requests | failed | p50 | p99 | max |",
        "|---|---|---|---|---|---|",
    ]
    for name, v in (("without a reload", w), ("with a reload", r)):
        lines.append(
            f"| {name} | {v['requests']} | {v['failed']} | {v['p50_ms']:.1f} ms "
            f"| {v['p99_ms']:.1f} ms | {v['max_ms']:.1f} ms |"
        )
    lines.append(f"\np99 during a reload / without: {r['p99_ms'] / w['p99_ms']:.2f}x")
    return "\n".join(lines)
