"""What dynamic batching buys, and what the server keeps of the runtime's throughput.

1. The same server with batching on and off, under the same closed-loop load.
2. Saturation: a closed loop of mixed lengths against the server, next to the same
   loop run in this process straight on the batcher and the runtime (the same
   batching policy and concurrency, no transport): the server's share of what the
   bare runtime reaches.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np

from attnserve.bench.load import LoadGenerator, RequestKind, summarize
from attnserve.client import EncoderClient
from attnserve.service.batcher import Batcher, BatcherOptions
from attnserve.service.metrics import Metrics
from attnserve.service.process import spawn_server
from attnserve.service.runtime import OrtRuntime, RuntimeOptions

VARIANTS = {"batching on": (), "batching off": ("--max-batch-size", "1")}
MIXED_LENGTHS = (8, 16, 32, 64, 128, 256, 512)  # equally likely per request


def measure_batching(
    model_dir: Path, concurrency: int = 64, seq_len: int = 16, duration: float = 10.0, log=print
) -> dict:
    """Closed loop at `concurrency` against each variant in turn; req/s and latency."""
    results = {}
    for name, flags in VARIANTS.items():
        server = spawn_server(model_dir, "--provider", "cpu", "--max-queue", "1024", *flags)
        try:
            EncoderClient(server.address).wait_until_serving(120)
            generator = LoadGenerator(server.address, [RequestKind(seq_len)], seed=0)
            asyncio.run(generator.closed_loop(concurrency, 1.0, progress=False))  # warm-up
            records, elapsed = asyncio.run(generator.closed_loop(concurrency, duration))
        finally:
            server.process.terminate()
            server.process.wait(30)
        summary = summarize(records, elapsed)
        results[name] = summary
        log(
            f"  {name}: {summary['achieved_rate']:.0f} req/s, "
            f"p99 {summary['latency_ms'].get('p99', float('nan')):.1f} ms"
        )
    on, off = results["batching on"]["achieved_rate"], results["batching off"]["achieved_rate"]
    return {
        "concurrency": concurrency,
        "seq_len": seq_len,
        "duration_s": duration,
        "variants": results,
        "speedup": round(on / off, 2) if off else None,
    }


def measure_saturation(
    model_dir: Path, concurrency: int = 64, duration: float = 10.0, log=print
) -> dict:
    """Tokens/s of the server and of the bare batcher + runtime on the same closed loop."""
    mix = [RequestKind(t) for t in MIXED_LENGTHS]
    server = spawn_server(
        model_dir, "--provider", "cpu", "--max-queue", "1024", "--metrics-port", "0"
    )
    try:
        EncoderClient(server.address).wait_until_serving(120)
        warm_up = LoadGenerator(server.address, mix, seed=1)
        asyncio.run(warm_up.closed_loop(concurrency, 1.0, progress=False))
        before = [server.metric(f"attnserve_batch_size_{s}") for s in ("sum", "count")]
        generator = LoadGenerator(server.address, mix, seed=0)  # draws as _bare_closed_loop
        records, elapsed = asyncio.run(generator.closed_loop(concurrency, duration))
        after = [server.metric(f"attnserve_batch_size_{s}") for s in ("sum", "count")]
    finally:
        server.process.terminate()
        server.process.wait(30)
    ok = [r for r in records if r.status == "OK"]
    sequences, batches = (b - a for a, b in zip(before, after, strict=True))
    served = {
        "tokens_per_s": round(sum(mix[r.kind].seq_len for r in ok) / elapsed, 1),
        "requests_per_s": round(len(ok) / elapsed, 1),
        "errors": len(records) - len(ok),
        "mean_batch_size": round(sequences / batches, 2) if batches else None,
    }
    bare = asyncio.run(_bare_closed_loop(model_dir, concurrency, duration))
    for name, r in (("server", served), ("bare runtime", bare)):
        log(
            f"  saturated, {name}: {r['tokens_per_s']:.0f} tokens/s, "
            f"{r['requests_per_s']:.0f} req/s, mean batch {r['mean_batch_size']}"
        )
    return {
        "concurrency": concurrency,
        "lengths": list(MIXED_LENGTHS),
        "duration_s": duration,
        "server": served,
        "bare": bare,
        "share": round(served["tokens_per_s"] / bare["tokens_per_s"], 3),
    }


async def _bare_closed_loop(model_dir: Path, concurrency: int, duration: float) -> dict:
    """The closed loop without a server: `concurrency` tasks awaiting the batcher in turn."""
    metrics = Metrics()
    batcher = Batcher(
        OrtRuntime(model_dir, RuntimeOptions(provider="cpu")), BatcherOptions(), metrics
    )
    batcher.start()
    data = [np.random.default_rng(t).integers(0, 256, size=t) for t in MIXED_LENGTHS]
    uniform = np.full(len(data), 1 / len(data))
    tokens = requests = 0
    rng = np.random.default_rng([1, 1])

    async def worker(until: float) -> None:  # as LoadGenerator.closed_loop's, tail included
        nonlocal tokens, requests
        while time.perf_counter() < until:
            ids = data[int(rng.choice(len(data), p=uniform))]  # LoadGenerator's draw
            await batcher.encode([ids])  # embeddings only
            tokens, requests = tokens + len(ids), requests + 1

    def batch_stats() -> list[float]:  # [sequences, batches] run so far
        return [
            metrics.registry.get_sample_value(f"attnserve_batch_size_{s}") or 0.0
            for s in ("sum", "count")
        ]

    warm_up = time.perf_counter() + 1.0
    await asyncio.gather(*(worker(warm_up) for _ in range(concurrency)))
    before, tokens, requests = batch_stats(), 0, 0
    rng = np.random.default_rng([0, 1])  # the kinds LoadGenerator(seed=0) draws, in order
    start = time.perf_counter()
    await asyncio.gather(*(worker(start + duration) for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    sequences, batches = (b - a for a, b in zip(before, batch_stats(), strict=True))
    await batcher.stop()
    return {
        "tokens_per_s": round(tokens / elapsed, 1),
        "requests_per_s": round(requests / elapsed, 1),
        "errors": 0,
        "mean_batch_size": round(sequences / batches, 2) if batches else None,
    }


def run_batching(out: Path, model_dir: Path, duration: float, log=print) -> dict:
    result = measure_batching(model_dir, duration=duration, log=log)
    result["saturation"] = measure_saturation(model_dir, duration=duration, log=log)
    out.mkdir(parents=True, exist_ok=True)
    (out / "batching.json").write_text(json.dumps(result, indent=1) + "\n")
    return result
