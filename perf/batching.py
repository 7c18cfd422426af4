"""What dynamic batching buys: the same server with batching on and off, under the same
closed-loop load of short requests. (Mixed lengths at saturation, against the runtime alone
and against KServe: peers.py.)"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from attnserve.bench.load import LoadGenerator, RequestKind, summarize
from attnserve.client import EncoderClient
from attnserve.service.process import spawn_server

VARIANTS = {"batching on": (), "batching off": ("--max-batch-size", "1")}


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


def run_batching(out: Path, model_dir: Path, duration: float, log=print) -> dict:
    result = measure_batching(model_dir, duration=duration, log=log)
    out.mkdir(parents=True, exist_ok=True)
    (out / "batching.json").write_text(json.dumps(result, indent=1) + "\n")
    return result
