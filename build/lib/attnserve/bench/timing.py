"""Side-by-side timing: every call in blocks, alternating, over a few rounds.

Slow drifts of a shared machine then hit every call alike, and the untimed
first call of each block absorbs whatever the previous one left behind
(threads still spinning down, caches). Torch-free.
"""

from __future__ import annotations

import time
from collections.abc import Callable

ROUNDS = 3


def timed(fn: Callable[..., object], *args: object) -> float:
    """Seconds one call of fn(*args) took."""
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def alternate(
    calls: dict[str, Callable[[], object]],
    least: int,
    most: int,
    seconds: float = 0.0,
    skip_on: type[Exception] | tuple[type[Exception], ...] = (),
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Samples (s) per call, and why calls that raised `skip_on` were dropped.

    Over all rounds each call gets at least `least` samples, more while it has
    used less than `seconds`, at most `most`.
    """
    samples: dict[str, list[float]] = {name: [] for name in calls}
    skipped: dict[str, str] = {}
    for _ in range(ROUNDS):
        for name, call in calls.items():
            if name in skipped:
                continue
            try:
                call()  # untimed warm-up of this block
            except skip_on as exc:
                skipped[name] = str(exc)
                continue
            spent, taken = 0.0, 0
            while taken < -(-least // ROUNDS) or (
                spent < seconds / ROUNDS and taken < most // ROUNDS
            ):
                elapsed = timed(call)
                samples[name].append(elapsed)
                spent += elapsed
                taken += 1
    return samples, skipped
