"""Servers with different flags side by side: one request at a time (p50 per length,
alternating blocks) or saturated (the peers benchmark's closed loop, alternating rounds).

    PYTHONPATH=. .venv/bin/python research/per-request-path/variants.py latency \
        '{"thread": ["--inline-max-ms=0"], "inline": []}'
    PYTHONPATH=. .venv/bin/python research/per-request-path/variants.py saturated \
        '{"default": [], "instances 3": ["--instances=3"]}'

The first variant is the baseline of the ratios.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys

import numpy as np

from attnserve.bench.default_model import model_dir_or_default
from attnserve.client import AsyncEncoderClient
from perf.full_maps import encode_ms, serve_attnserve
from perf.peers import _closed_loop

LENGTHS, CALLS, BLOCKS, ROUNDS = (8, 32, 128, 512), 150, 5, 3


async def latency(addresses: dict[str, str]) -> dict[str, dict[int, list[float]]]:
    clients = {name: AsyncEncoderClient(address) for name, address in addresses.items()}
    times: dict[str, dict[int, list[float]]] = {name: {t: [] for t in LENGTHS} for name in clients}
    for block in range(BLOCKS + 1):  # the first block warms up
        for t in LENGTHS:
            for name, client in clients.items():
                ms = await encode_ms(client, t, CALLS if t < 512 else CALLS // 4)
                if block:
                    times[name][t] += ms
    return times


def main() -> None:
    mode, variants = sys.argv[1], json.loads(sys.argv[2])
    base = next(iter(variants))
    with model_dir_or_default(None, lambda _: None) as model_dir:
        if mode == "latency":
            with contextlib.ExitStack() as stack:
                addresses = {
                    name: stack.enter_context(serve_attnserve(model_dir, *flags))
                    for name, flags in variants.items()
                }
                times = asyncio.run(latency(addresses))
            for t in LENGTHS:
                p50 = {name: float(np.median(times[name][t])) for name in variants}
                print(f"T = {t}: " + ", ".join(
                    f"{name} {ms:.3f} ms ({ms / p50[base]:.3f}x)" for name, ms in p50.items()
                ))  # fmt: skip
            return
        mixed = list(range(8, 513))
        rates: dict[str, list[float]] = {name: [] for name in variants}
        for round_ in range(ROUNDS):
            for name, flags in variants.items():
                with serve_attnserve(model_dir, *flags) as address:
                    rates[name].append(_closed_loop(address, mixed, 10.0)["tokens_per_s"])
            print(f"round {round_ + 1}: " + ", ".join(f"{n} {r[-1]:.0f}" for n, r in rates.items()))
        for name, r in rates.items():
            ratio = np.median(r) / np.median(rates[base])
            print(f"{name}: {np.median(r):.0f} tokens/s ({ratio:.3f}x)")


if __name__ == "__main__":
    main()
