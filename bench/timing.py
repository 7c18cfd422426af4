"""Side-by-side timing: every call in blocks, alternating, over a few rounds.

Slow drifts of a shared machine then hit every call alike, and each block
starts with untimed calls that absorb whatever the previous one left behind.
One call is not enough on this kind of machine: after another engine's block
(or any pause of a few milliseconds) a short ORT run takes 2-3x its steady time
for its next ~5 calls, about 3 ms, whichever engine ran before. So the warm-up
lasts at least WARMUP_S. Torch-free.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

ROUNDS = 3
WARMUP_S = 0.02  # untimed calls at the start of each block: at least one, and this long


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
    answers: dict[str, list] | None = None,
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Samples (s) per call, and why calls that raised `skip_on` were dropped.

    Over all rounds each call gets at least `least` samples, more while it has
    used less than `seconds`, at most `most`. `answers`: for the calls it names,
    what each timed call returned is appended there (warm-up calls are left out).
    """
    answers = answers or {}
    samples: dict[str, list[float]] = {name: [] for name in calls}
    skipped: dict[str, str] = {}
    for _ in range(ROUNDS):
        for name, call in calls.items():
            if name in skipped:
                continue
            try:
                _warm_up(call)
            except skip_on as exc:
                skipped[name] = str(exc)
                continue
            spent, taken = 0.0, 0
            while taken < -(-least // ROUNDS) or (
                spent < seconds / ROUNDS and taken < most // ROUNDS
            ):
                start = time.perf_counter()
                answer = call()
                elapsed = time.perf_counter() - start
                samples[name].append(elapsed)
                if name in answers:
                    answers[name].append(answer)
                spent += elapsed
                taken += 1
    return samples, skipped


def repeated(
    calls: dict[str, Callable[[], object]], repeats: int, answers: dict[str, list] | None = None
) -> dict[str, list[float]]:
    """Samples (s) per call: each call `repeats` times per round, alternating in blocks."""
    return alternate(calls, least=repeats * ROUNDS, most=repeats * ROUNDS, answers=answers)[0]


def p50_ms(samples: list[float]) -> float:
    """The median of `samples` (seconds), in milliseconds."""
    return statistics.median(samples) * 1e3


def _warm_up(call: Callable[[], object]) -> None:
    """Untimed calls: at least one, until WARMUP_S has passed."""
    end = time.perf_counter() + WARMUP_S
    call()
    while time.perf_counter() < end:
        call()
