import itertools

from attnserve.bench.timing import ROUNDS, alternate, p50_ms, repeated


def test_alternate_keeps_the_answers_of_timed_calls_only():
    counters = {"a": itertools.count(), "b": itertools.count()}
    calls = {name: counter.__next__ for name, counter in counters.items()}
    answers = {"a": []}
    samples, skipped = alternate(calls, least=2 * ROUNDS, most=2 * ROUNDS, answers=answers)
    assert skipped == {}
    assert [len(s) for s in samples.values()] == [2 * ROUNDS, 2 * ROUNDS]
    # each block warms up with untimed calls first: the answers kept are the timed ones
    kept = answers["a"]
    assert len(kept) == 2 * ROUNDS
    calls_made = next(counters["a"])
    assert calls_made > len(kept)
    assert kept == sorted(kept) and kept[0] > 0


def test_alternate_drops_a_call_that_raises_skip_on():
    def too_large():
        raise OverflowError("over the limit")

    samples, skipped = alternate(
        {"ok": lambda: None, "big": too_large}, 3, 3, skip_on=OverflowError
    )
    assert skipped == {"big": "over the limit"}
    assert len(samples["ok"]) == 3 and samples["big"] == []


def test_repeated_times_each_call_repeats_times_a_round_and_p50_is_in_ms():
    answers = {"b": []}
    samples = repeated({"a": lambda: 1, "b": lambda: 2}, repeats=4, answers=answers)
    assert {name: len(s) for name, s in samples.items()} == {"a": 4 * ROUNDS, "b": 4 * ROUNDS}
    assert answers["b"] == [2] * (4 * ROUNDS)
    assert p50_ms([0.003, 0.001, 0.002, 0.010]) == 2.5  # the mean of the middle two, in ms
