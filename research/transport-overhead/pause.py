"""The model's run after a pause: how much of "ORT inside the server" is the wait before it.

A server's run always follows a pause (it waits at least a round trip for its next
request), while the runtime alone is timed back to back. So `run.py grpc` also times the
same 8-token run in its own process, without gRPC, after each of PAUSES_MS, two ways:

- the server's runtime, sleeping through the pause, as a server waits;
- a one-thread runtime spinning on its own thread, so nothing that runs the model leaves
  its CPU. If this one slows down too, neither idle threads nor idle CPUs are the cause:
  what the run had in the caches is gone when the pause ends, taken by whatever else the
  machine runs.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from attnserve.bench.timing import p50_ms, repeated, timed
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions

PAUSES_MS = (0.0, 0.5, 2.0, 10.0)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def after_pause(
    model_dir: Path, runtime: OrtRuntime, quick: bool, log: Callable[[str], None]
) -> list[dict]:
    """One row per pause: `runtime` asleep, and a one-thread runtime spinning, each over its
    own back-to-back run. The pauses and the two ways alternate in blocks."""
    one_thread = OrtRuntime(model_dir, RuntimeOptions(provider="cpu", intra_op_threads=1))
    ids = np.random.default_rng(3).integers(0, runtime.config.vocab_size, (1, 8), dtype=np.int64)

    def run_after(wait: Callable[[float], None], pause_s: float, model: OrtRuntime) -> float:
        if pause_s:
            wait(pause_s)
        return timed(model.embed, ids)

    ways = {"sleep": (time.sleep, runtime), "spin": (_spin, one_thread)}
    calls = {
        f"{way} {p:g}": functools.partial(run_after, wait, p / 1e3, model)
        for p in PAUSES_MS
        for way, (wait, model) in ways.items()
    }
    runs: dict[str, list] = {name: [] for name in calls}
    repeated(calls, repeats=5 if quick else 100, answers=runs)
    rows = [
        {
            "pause_ms": p,
            "runtime_p50_ms": round(p50_ms(runs[f"sleep {p:g}"]), 4),
            "spinning_one_thread_p50_ms": round(p50_ms(runs[f"spin {p:g}"]), 4),
        }
        for p in PAUSES_MS
    ]
    for row in rows:
        row["to_back_to_back"] = round(row["runtime_p50_ms"] / rows[0]["runtime_p50_ms"], 2)
        row["spinning_to_back_to_back"] = round(
            row["spinning_one_thread_p50_ms"] / rows[0]["spinning_one_thread_p50_ms"], 2
        )
    log(
        "  8 tokens in process after a pause: "
        + ", ".join(
            f"{r['runtime_p50_ms']:.2f} ms asleep / {r['spinning_one_thread_p50_ms']:.2f} ms "
            f"spinning (one thread) after {r['pause_ms']:g} ms"
            for r in rows
        )
    )
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "The same 8-token run in this process, without gRPC, timed alone after a pause: "
        "the server's runtime asleep, as a server waits for its next request, and a "
        "one-thread runtime spinning on its own thread, so nothing that runs the model "
        "leaves its CPU. Each over its own back-to-back run:",
        "",
        "| pause | asleep p50 | / back to back | spinning, one ORT thread p50 | / back to back |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['pause_ms']:g} ms | {r['runtime_p50_ms']:.2f} ms | {r['to_back_to_back']:.2f}x "
        f"| {r['spinning_one_thread_p50_ms']:.2f} ms | {r['spinning_to_back_to_back']:.2f}x |"
        for r in rows
    ]
    return "\n".join(lines)
