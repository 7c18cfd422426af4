"""attnserve beside the server a user would pick instead: KServe's Python model server.

Both serve the same graphs with the same ORT session settings (runtime.session_settings)
on this machine, each through its own usual client (attnserve's AsyncEncoderClient;
tritonclient for KServe), measured side by side in one run:

1. latency of one request at a time, T = 8, 32, 128, 512 (embeddings) and all attention
   weights in float32 at 512, alternating blocks;
2. saturated throughput, 64 requests in flight, lengths uniform in 8..512 on the same
   draws: attnserve (its batching policy; the policy before it; no batching), KServe,
   and ORT alone in this process, one request at a time and through the batcher;
3. an open loop (Poisson) at 70% of KServe's saturated rate, same mix: p50 and p99.

KServe and tritonclient run in their own environment (peer_env.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import numpy as np

from attnserve.bench.load import LoadGenerator, RequestKind, summarize
from attnserve.bench.results import save
from attnserve.client import AsyncEncoderClient, ClientOptions
from attnserve.model.artifacts import ModelDirectory
from attnserve.service.core.batcher import Batcher, BatcherOptions
from attnserve.service.core.metrics import Metrics
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from attnserve.service.process import spawn_server
from attnserve.service.server import model_instances
from attnserve.service.settings import Settings
from benchmarks.peer_env import KSERVE_PINS, KServePeer, ort_distribution, peer_venv

LATENCY_LENGTHS = (8, 32, 128, 512)  # and all attention weights at the longest
SHORTEST, LONGEST = 8, 512  # the mixed load: lengths uniform in 8..512
CONCURRENCY = 64
OPEN_LOOP_SHARE = 0.7  # of KServe's saturated rate
# attnserve's servers in the saturation rows: its policy, the one before it, none.
VARIANTS = {
    "attnserve": (),
    "attnserve, previous policy": (
        "--max-batched-seq-len=100000",
        "--max-padding=1e9",
        "--instances=1",
    ),
    "attnserve, no batching": ("--max-batch-size=1",),
}
SEED = 0


@contextlib.contextmanager
def _attnserve(model_dir: Path, *flags: str) -> Iterator[str]:
    server = spawn_server(model_dir, "--provider", "cpu", "--max-queue", "1024", *flags)
    try:
        yield server.address
    finally:
        server.process.terminate()
        server.process.wait(30)


async def encode_ms(client: AsyncEncoderClient, seq_len: int, n: int, **options) -> list[float]:
    """`n` sequential Encode calls of one seeded `seq_len`-token sequence: each call's ms."""
    ids = np.random.default_rng(seq_len).integers(0, 256, size=seq_len).tolist()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        await client.encode([ids], **options)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _percentile_row(times: list[float]) -> dict:
    return {"p50_ms": round(float(np.median(times)), 3), "p99_ms": round(_p99(times), 3)}


def _p99(times: list[float]) -> float:
    return float(np.percentile(times, 99))


def measure_latency(
    address: str, peer: KServePeer, lengths: list[int], blocks: int, log
) -> list[dict]:
    """One request at a time, both servers in alternating blocks (the order flips)."""
    longest = lengths[-1]
    cases = [(t, False, 40 if t < longest else 10) for t in lengths] + [(longest, True, 3)]
    times = {(t, a): {"attnserve": [], "kserve": []} for t, a, _ in cases}
    # One client and one channel for the whole run, as the peer's driver keeps its own.
    with asyncio.Runner() as runner:
        client = AsyncEncoderClient(address, ClientOptions(timeout_s=120))
        for block in range(blocks):
            for seq_len, attention, n in cases:
                order = ("attnserve", "kserve") if block % 2 == 0 else ("kserve", "attnserve")
                for name in order:
                    if name == "attnserve":
                        ms = runner.run(encode_ms(client, seq_len, n, attention=attention))
                    else:
                        ms = peer.ask("latency", seq_len=seq_len, n=n, attention=attention)["ms"]
                    times[seq_len, attention][name] += ms
            log(f"  latency block {block + 1}/{blocks}")
        runner.run(client.close())
    rows = []
    for (seq_len, attention), by_server in times.items():
        a, k = (_percentile_row(by_server[s]) for s in ("attnserve", "kserve"))
        rows.append(
            {
                "seq_len": seq_len,
                "attention": "all, float32" if attention else "none",
                "attnserve": a,
                "kserve": k,
                "p50_ratio": round(a["p50_ms"] / k["p50_ms"], 3),
                "p99_ratio": round(a["p99_ms"] / k["p99_ms"], 3),
            }
        )
    return rows


def _closed_loop(address: str, mixed: list[int], duration: float) -> dict:
    mix = [RequestKind(t) for t in mixed]
    warm_up = LoadGenerator(address, mix, seed=SEED + 1)  # other draws
    asyncio.run(warm_up.closed_loop(CONCURRENCY, 1.0, progress=False))
    generator = LoadGenerator(address, mix, seed=SEED)
    records, elapsed = asyncio.run(generator.closed_loop(CONCURRENCY, duration, progress=False))
    ok = [r for r in records if r.status == "OK"]
    tokens = sum(mixed[r.kind] for r in ok)
    return {**_rates(tokens, len(ok), elapsed), "errors": len(records) - len(ok)}


def _peer_closed_loop(peer: KServePeer, mixed: list[int], duration: float) -> dict:
    loop = {"concurrency": CONCURRENCY, "lengths": mixed}
    peer.ask("closed", duration=1.0, seed=SEED + 1, **loop)  # warm-up on other draws
    r = peer.ask("closed", duration=duration, seed=SEED, **loop)
    return {**_rates(r["tokens"], r["requests"], r["elapsed"]), "errors": r["errors"]}


def _draws(mixed: list[int], count: int = 4096) -> list[np.ndarray]:
    """The ids LoadGenerator(mix of `mixed`, seed SEED) sends, in its order."""
    kind_rng = np.random.default_rng([SEED, 1])
    data_rng = np.random.default_rng([SEED, 2])
    data = [data_rng.integers(0, 256, size=n) for n in mixed]
    uniform = np.full(len(mixed), 1 / len(mixed))
    return [data[int(kind_rng.choice(len(mixed), p=uniform))] for _ in range(count)]


def _rates(tokens: int, requests: int, elapsed: float) -> dict:
    return {
        "tokens_per_s": round(tokens / elapsed, 1),
        "requests_per_s": round(requests / elapsed, 1),
    }


def _in_process_one_at_a_time(runtime: OrtRuntime, mixed: list[int], duration: float) -> dict:
    draws, tokens, requests = _draws(mixed), 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < duration:
        ids = draws[requests % len(draws)]
        runtime.embed(ids[None, :])
        tokens, requests = tokens + len(ids), requests + 1
    return _rates(tokens, requests, time.perf_counter() - start)


async def _in_process_batched(
    runtime: OrtRuntime, instances: list[OrtRuntime], mixed: list[int], duration: float
) -> dict:
    """The same draws through the batcher and the instances, `CONCURRENCY` in flight."""
    metrics = Metrics().for_model(runtime.config.name, "1")
    batcher = Batcher(runtime, BatcherOptions(max_queue=1024), metrics, instances=instances)
    batcher.start()
    draws, tokens, requests = _draws(mixed), 0, 0

    async def worker() -> None:
        nonlocal tokens, requests
        while time.perf_counter() - start < duration:
            ids = draws[requests % len(draws)]
            requests += 1
            await batcher.encode([ids])
            tokens += len(ids)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    elapsed = time.perf_counter() - start
    await batcher.stop()
    return _rates(tokens, requests, elapsed)


def measure_saturation(
    model_dir: Path,
    peer: KServePeer,
    runtime: OrtRuntime,
    mixed: list[int],
    duration: float,
    rounds: int,
    log,
) -> dict:
    """Every engine on the same closed loop, in turn, `rounds` times; medians."""
    # The server's own instances (by default one per core, a thread each), warmed as it warms.
    settings = Settings(model=model_dir, provider="cpu")
    instances = model_instances(ModelDirectory(model_dir), settings, "cpu")
    for instance in instances:
        instance.warmup()
    runs: dict[str, list[dict]] = {}
    for round_ in range(rounds):
        for name, flags in VARIANTS.items():
            with _attnserve(model_dir, *flags) as address:
                runs.setdefault(name, []).append(_closed_loop(address, mixed, duration))
        runs.setdefault("KServe", []).append(_peer_closed_loop(peer, mixed, duration))
        runs.setdefault("ORT in process, one at a time", []).append(
            _in_process_one_at_a_time(runtime, mixed, duration)
        )
        runs.setdefault("ORT in process, batcher", []).append(
            asyncio.run(_in_process_batched(runtime, instances, mixed, duration))
        )
        log(
            f"  saturation round {round_ + 1}/{rounds}: "
            + ", ".join(f"{name} {r[-1]['tokens_per_s']:.0f}" for name, r in runs.items())
        )
    engines = {
        name: {
            "tokens_per_s": float(np.median([r["tokens_per_s"] for r in rs])),
            "requests_per_s": float(np.median([r["requests_per_s"] for r in rs])),
            "errors": sum(r.get("errors", 0) for r in rs),
            "runs": [r["tokens_per_s"] for r in rs],
        }
        for name, rs in runs.items()
    }
    ours = engines["attnserve"]["tokens_per_s"]
    floor = max(
        engines[n]["tokens_per_s"]
        for n in ("ORT in process, one at a time", "ORT in process, batcher")
    )
    return {
        "concurrency": CONCURRENCY,
        "lengths": [mixed[0], mixed[-1]],
        "duration_s": duration,
        "rounds": rounds,
        "engines": engines,
        "vs_kserve": round(ours / engines["KServe"]["tokens_per_s"], 3),
        "vs_best_in_process": round(ours / floor, 3),
        "vs_one_at_a_time_in_process": round(
            ours / engines["ORT in process, one at a time"]["tokens_per_s"], 3
        ),
        "policy_gain": round(ours / engines["attnserve, previous policy"]["tokens_per_s"], 3),
    }


def measure_open_loop(
    address: str, peer: KServePeer, mixed: list[int], rate: float, duration: float
) -> dict:
    """Poisson arrivals at `rate` on the mixed lengths: latency from the intended send time."""
    generator = LoadGenerator(address, [RequestKind(t) for t in mixed], seed=SEED)
    records, _ = asyncio.run(generator.open_loop(rate, duration, progress=False))
    ours = summarize(records, duration)
    theirs = peer.ask("open", rate=rate, duration=duration, seed=SEED, lengths=mixed)
    a = {
        "p50_ms": ours["latency_ms"]["p50"],
        "p99_ms": ours["latency_ms"]["p99"],
        "errors": sum(ours["errors"].values()),
    }
    k = {**_percentile_row(theirs["ms"]), "errors": theirs["errors"]}
    return {
        "rate_per_s": round(rate, 2),
        "duration_s": duration,
        "attnserve": a,
        "kserve": k,
        "p99_ratio": round(a["p99_ms"] / k["p99_ms"], 3),
    }


def run_peers(
    out: Path,
    model_dir: Path,
    venv: Path,
    duration: float = 10.0,
    blocks: int = 5,
    rounds: int = 3,
    log: Callable[[str], None] = print,
) -> dict:
    python = peer_venv(venv, log)
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    longest = min(LONGEST, runtime.config.max_seq_len)
    lengths = sorted({min(t, longest) for t in LATENCY_LENGTHS})
    mixed = list(range(SHORTEST, longest + 1))
    peer = KServePeer(python, model_dir, runtime)
    try:
        with _attnserve(model_dir) as address:
            log("peers: latency, one request at a time")
            latency = measure_latency(address, peer, lengths, blocks, log)
        log("peers: saturation")
        saturation = measure_saturation(model_dir, peer, runtime, mixed, duration, rounds, log)
        rate = OPEN_LOOP_SHARE * saturation["engines"]["KServe"]["requests_per_s"]
        log(f"peers: open loop at {rate:.1f} requests/s")
        with _attnserve(model_dir) as address:
            open_loop = measure_open_loop(address, peer, mixed, rate, 2 * duration)
    finally:
        peer.close()
    result = {
        "machine": {"cpus": len(os.sched_getaffinity(0)), "cpu": platform.processor()},
        "versions": {
            "kserve": KSERVE_PINS[0].split("==")[1],
            "tritonclient": KSERVE_PINS[1].split("==")[1],
            "onnxruntime": metadata.version(ort_distribution()),
            "python": platform.python_version(),
        },
        "latency": latency,
        "saturation": saturation,
        "open_loop": open_loop,
    }
    save(out, "peers", result, table(result))
    return result


def targets(result: dict) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for each target of the run against the peers."""
    lat, s, o = result["latency"], result["saturation"], result["open_loop"]
    plain = [r for r in lat if r["attention"] == "none"]
    p50 = ", ".join(f"{r['p50_ratio']:.2f}" for r in plain)
    p99 = ", ".join(f"{r['p99_ratio']:.2f}" for r in plain)
    lengths = ", ".join(str(r["seq_len"]) for r in plain)
    return [
        (
            "saturated tokens/s >= 1.2x KServe's",
            f"{s['vs_kserve']:.2f}x",
            s["vs_kserve"] >= 1.2,
        ),
        (
            ">= 1.05x ORT in process one request at a time (same draws)",
            f"{s['vs_one_at_a_time_in_process']:.2f}x",
            s["vs_one_at_a_time_in_process"] >= 1.05,
        ),
        (
            f"single-request p50 <= 0.9x KServe's at T = {lengths}",
            f"{p50}x",
            all(r["p50_ratio"] <= 0.9 for r in plain),
        ),
        (
            f"single-request p99 <= 1.0x KServe's at T = {lengths}",
            f"{p99}x",
            all(r["p99_ratio"] <= 1.0 for r in plain),
        ),
        (
            "open loop at 70% of KServe's saturated rate: p99 <= 0.8x KServe's",
            f"{o['p99_ratio']:.2f}x",
            o["p99_ratio"] <= 0.8,
        ),
    ]


def table(result: dict) -> str:
    """The three measurements and the targets as markdown."""
    v = result["versions"]
    lines = [
        f"attnserve vs KServe {v['kserve']} (tritonclient {v['tritonclient']}), "
        f"ONNX Runtime {v['onnxruntime']}, the same graphs and session settings.",
        "",
        "| request | attnserve p50 / p99 ms | KServe p50 / p99 ms | p50 ratio | p99 ratio |",
        "|---|---|---|---|---|",
    ]
    for row in result["latency"]:
        a, k = row["attnserve"], row["kserve"]
        what = f"T={row['seq_len']}" + (", all attention f32" if row["attention"] != "none" else "")
        lines.append(
            f"| {what} | {a['p50_ms']:.2f} / {a['p99_ms']:.2f} | {k['p50_ms']:.2f} / "
            f"{k['p99_ms']:.2f} | {row['p50_ratio']:.2f}x | {row['p99_ratio']:.2f}x |"
        )
    s = result["saturation"]
    lines += [
        "",
        f"Saturated, {s['concurrency']} in flight, lengths uniform in "
        f"{s['lengths'][0]}..{s['lengths'][1]} (same draws; median of {s['rounds']} rounds "
        f"of {s['duration_s']:g} s):",
        "",
        "| engine | tokens/s | requests/s | attnserve / it |",
        "|---|---|---|---|",
    ]
    ours = s["engines"]["attnserve"]["tokens_per_s"]
    for name, e in s["engines"].items():
        lines.append(
            f"| {name} | {e['tokens_per_s']:,.0f} | {e['requests_per_s']:.1f} | "
            f"{ours / e['tokens_per_s']:.2f}x |"
        )
    o = result["open_loop"]
    lines += [
        "",
        f"Open loop (Poisson) at {o['rate_per_s']:.1f} requests/s (70% of KServe's saturated "
        f"rate), {o['duration_s']:g} s, same mix: attnserve p50 {o['attnserve']['p50_ms']:.1f} ms "
        f"/ p99 {o['attnserve']['p99_ms']:.1f} ms, KServe p50 {o['kserve']['p50_ms']:.1f} ms / "
        f"p99 {o['kserve']['p99_ms']:.1f} ms: p99 ratio {o['p99_ratio']:.2f}x.",
        "",
        "| target | measured | met |",
        "|---|---|---|",
    ]
    lines += [
        f"| {name} | {measured} | {'yes' if met else '**no**'} |"
        for name, measured, met in targets(result)
    ]
    return "\n".join(lines)
