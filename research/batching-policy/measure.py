"""Where the time goes on the mixed load, and which batching policy wins (in process).

1. The cost of one sequence at each length on one and on two ORT threads, and what a
   batch of B equal sequences saves per sequence on one thread.
2. The mixed load (lengths uniform in 8..512, 64 in flight) through the real batcher:
   the policy before (every length batched, one session), one request at a time, the
   cost-aware policy on one session, and with model instances.

    .venv/bin/python research/batching-policy/measure.py [--model models/default]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from attnserve.service.core.batcher import Batcher, BatcherOptions
from attnserve.service.core.metrics import Metrics
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions

LENGTHS = (8, 16, 32, 64, 128, 256, 512)
PREVIOUS = {"max_batched_seq_len": 100_000, "max_padding": 1e9}
POLICIES = {  # name: (BatcherOptions overrides, with instances)
    "previous policy": (PREVIOUS, False),
    "one at a time": ({"max_batch_size": 1}, False),
    "cost-aware, one session": ({}, False),
    "cost-aware + 2 instances": ({}, True),
    "one at a time + 2 instances": ({"max_batch_size": 1}, True),
}


def median_ms(runtime: OrtRuntime, batch: int, seq_len: int) -> float:
    ids = np.random.default_rng(0).integers(0, 256, (batch, seq_len))
    runtime.embed(ids)
    times = []
    for _ in range(max(3, 3000 // (batch * seq_len) + 2)):
        start = time.perf_counter()
        runtime.embed(ids)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def costs(wide: OrtRuntime, narrow: OrtRuntime) -> None:
    print("T     2 threads  1 thread   per-sequence gain of a batch of B (1 thread)")
    for t in LENGTHS:
        solo = median_ms(narrow, 1, t)
        gains = [
            f"B{b} x{solo / (median_ms(narrow, b, t) / b):.2f}"
            for b in (2, 4, 8, 16)
            if b * t <= 4096
        ]
        print(f"{t:<5} {median_ms(wide, 1, t):8.2f}  {solo:8.2f}   " + "  ".join(gains))


async def closed_loop(wide, narrow, overrides, with_instances, seconds, seed) -> float:
    options = BatcherOptions(max_queue=1024, **overrides)
    metrics = Metrics().for_model("default", "1")
    batcher = Batcher(wide, options, metrics, instances=narrow if with_instances else ())
    batcher.start()
    rng, tokens = np.random.default_rng(seed), 0

    async def worker(until: float) -> None:
        nonlocal tokens
        while time.perf_counter() < until:
            n = int(rng.integers(8, 513))
            await batcher.encode([rng.integers(0, 256, n)])
            tokens += n

    start = time.perf_counter()
    await asyncio.gather(*(worker(start + seconds) for _ in range(64)))
    elapsed = time.perf_counter() - start
    await batcher.stop()
    return tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/default")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    wide = OrtRuntime(args.model, RuntimeOptions(provider="cpu"))
    narrow = [
        OrtRuntime(args.model, RuntimeOptions(provider="cpu", intra_op_threads=1)) for _ in range(2)
    ]
    for runtime in (wide, *narrow):
        runtime.warmup()
    costs(wide, narrow[0])
    runs: dict[str, list[float]] = {name: [] for name in POLICIES}
    for round_ in range(args.rounds):  # the policies alternate, round after round
        for name, (overrides, with_instances) in POLICIES.items():
            loop = closed_loop(wide, narrow, overrides, with_instances, args.seconds, round_)
            runs[name].append(asyncio.run(loop))
    base = np.median(runs["one at a time"])
    print("\nmixed load, 64 in flight: tokens/s (median of rounds), against one at a time")
    for name, values in runs.items():
        print(f"{name:28s} {np.median(values):8.0f}  {np.median(values) / base:.2f}x")


if __name__ == "__main__":
    main()
