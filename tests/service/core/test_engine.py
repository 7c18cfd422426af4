"""The batching policy, with a fake backend and a fake clock: no ONNX Runtime, no sleeps.

Each scenario holds the "model" busy with a gate, queues work behind it, then
opens the gate and reads the batches the backend was handed.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from attnserve.service.core.backend import AttentionSelection, ReadoutSelection, SiteChange
from attnserve.service.core.batching import BatcherOptions
from attnserve.service.core.engine import Engine
from attnserve.service.core.errors import (
    DeadlineExceededError,
    InferenceError,
    NotReadyError,
    QueueFullError,
)
from attnserve.service.core.metrics import Metrics
from tests.service.fakes import FAKE_CONFIG, FakeBackend, FakeClock

ALL_HEADS = AttentionSelection(
    tuple(range(FAKE_CONFIG.n_layers)), tuple(range(FAKE_CONFIG.n_heads))
)


def ids(n: int, start: int = 1) -> np.ndarray:
    return (np.arange(n, dtype=np.int64) + start) % 250


class Scenario:
    """A started batcher over a gated FakeBackend, and helpers to hold and release it."""

    def __init__(
        self, backend: FakeBackend | None = None, clock=None, instances=(), **options
    ) -> None:
        self.backend = backend or FakeBackend()
        self.metrics = Metrics()
        # No inline runs unless a test asks: a gated call on the event loop would stall it.
        defaults = {"max_batch_tokens": 64, "max_batched_seq_len": 64, "inline_max_s": 0.0}
        options = BatcherOptions(**{**defaults, **options})
        model_metrics = self.metrics.for_model("fake", "1")
        self.engine = Engine(self.backend, options, model_metrics, clock, instances)
        self.engine.start()

    async def hold(self) -> asyncio.Task:
        """Occupy the model with one 1-token sequence and wait until it is inside."""
        self.backend.gate.clear()
        blocker = asyncio.ensure_future(self.engine.encode([ids(1)]))
        await asyncio.to_thread(self.backend.wait_calls, len(self.backend.calls) + 1)
        return blocker

    def queue(self, *sequences: np.ndarray, attention: bool = False, **kw) -> asyncio.Task:
        selections = [ALL_HEADS] * len(sequences) if attention else None
        return asyncio.ensure_future(self.engine.encode(list(sequences), selections, **kw))

    async def settle(self) -> None:
        """Let queued tasks reach the batcher (one turn of the event loop each)."""
        for _ in range(3):
            await asyncio.sleep(0)

    def release(self) -> None:
        self.backend.gate.set()

    def batches(self, skip: int = 1) -> list[tuple[str, tuple[int, ...]]]:
        """(method, padded shape) of each backend call, without the first `skip` (blockers)."""
        return self.backend.shapes()[skip:]

    def metric(self, name: str) -> float:
        labels = {"model": "fake", "version": "1"}
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def run(scenario_coroutine):
    return asyncio.run(scenario_coroutine())


def test_token_budget_caps_batch_size_times_longest():
    async def scenario():
        s = Scenario(max_batch_tokens=64)
        blocker = await s.hold()
        work = [s.queue(ids(30)) for _ in range(3)]
        await s.settle()
        s.release()
        await asyncio.gather(blocker, *work)
        return s.batches()

    # 2 x 30 = 60 fits 64 tokens, a third would make 90.
    assert run(scenario) == [("embed", (2, 30)), ("embed", (1, 30))]


def test_max_batch_size_caps_sequences_per_batch():
    async def scenario():
        s = Scenario(max_batch_size=2)
        blocker = await s.hold()
        work = [s.queue(ids(4)) for _ in range(5)]
        await s.settle()
        s.release()
        await asyncio.gather(blocker, *work)
        return s.batches()

    assert run(scenario) == [("embed", (2, 4)), ("embed", (2, 4)), ("embed", (1, 4))]


def test_the_oldest_sequence_takes_those_nearest_its_length():
    async def scenario():
        s = Scenario(max_batch_tokens=64)
        blocker = await s.hold()
        work = [s.queue(ids(n)) for n in (20, 5, 19, 40, 21)]
        await s.settle()
        s.release()
        await asyncio.gather(blocker, *work)
        return [ids.shape for _, ids in s.backend.calls[1:]], s.backend.calls[1][1]

    shapes, first = run(scenario)
    # 20 (oldest) takes 19 and 21 (3 x 21 = 63 tokens); 5 and 40 would break the budget.
    assert shapes == [(3, 21), (1, 5), (1, 40)]
    assert sorted(int((row != 256).sum()) for row in first) == [19, 20, 21]


def test_sequences_longer_than_max_batched_seq_len_run_alone():
    async def scenario():
        s = Scenario(max_batched_seq_len=8)
        blocker = await s.hold()
        work = [s.queue(ids(n)) for n in (10, 10, 4, 4, 10)]
        await s.settle()
        s.release()
        await asyncio.gather(blocker, *work)
        return s.batches()

    assert run(scenario) == [
        ("embed", (1, 10)),
        ("embed", (1, 10)),
        ("embed", (2, 4)),
        ("embed", (1, 10)),
    ]


def test_a_sequence_joins_a_batch_only_while_padding_stays_under_max_padding():
    async def scenario():
        s = Scenario(max_padding=0.25)
        blocker = await s.hold()
        # 8 + 7 pads 1 token of 16 (ok); a 2 would pad 14 of 31 (too much) and waits.
        work = [s.queue(ids(n)) for n in (8, 2, 7)]
        await s.settle()
        s.release()
        await asyncio.gather(blocker, *work)
        return s.batches()

    assert run(scenario) == [("embed", (2, 8)), ("embed", (1, 2))]


def test_a_lone_batch_runs_on_the_main_backend_with_every_core():
    async def scenario():
        instances = [FakeBackend(), FakeBackend()]
        s = Scenario(instances=instances)
        await s.engine.encode([ids(5)])
        return s.backend.shapes(), [i.shapes() for i in instances]

    main, instances = run(scenario)
    assert main == [("embed", (1, 5))]
    assert instances == [[], []]


def test_waiting_batches_run_side_by_side_on_the_instances():
    async def scenario():
        instances = [FakeBackend(), FakeBackend()]
        for backend in instances:
            backend.gate.clear()
        s = Scenario(instances=instances, max_batched_seq_len=8)
        work = s.queue(ids(20), ids(21), ids(22))  # each runs alone
        # Two batches are inside the model at once, one per instance; the third waits.
        for backend in instances:
            await asyncio.to_thread(backend.wait_calls, 1)
        depth, inside = s.engine.depth, [len(b.calls) for b in instances]
        for backend in instances:
            backend.gate.set()
        results = await work
        return depth, inside, s.backend.calls, instances, results

    depth, inside, main_calls, instances, results = run(scenario)
    assert depth == 1 and inside == [1, 1]
    shapes = sorted(ids.shape for b in instances for _, ids in b.calls) + [
        ids.shape for _, ids in main_calls
    ]
    assert sorted(shapes) == [(1, 20), (1, 21), (1, 22)]
    assert [r.embeddings.shape[0] for r in results] == [20, 21, 22]


def test_the_main_backend_never_runs_beside_an_instance():
    async def scenario():
        instances = [FakeBackend(), FakeBackend()]
        s = Scenario(instances=instances, max_batched_seq_len=8)
        blocker = await s.hold()  # alone: on the main backend, every core busy
        work = s.queue(ids(20), ids(21))
        await s.settle()
        waiting = s.engine.depth, [len(b.calls) for b in instances]
        s.release()
        await asyncio.gather(blocker, work)
        return waiting, [b.shapes() for b in instances]

    (depth, inside), ran = run(scenario)
    assert depth == 2 and inside == [0, 0]  # held back while the main backend ran
    assert sorted(ran) == [[("embed", (1, 20))], [("embed", (1, 21))]]


def test_embeddings_attention_and_readouts_each_batch_apart():
    """Three backend calls; readouts with different head masks still share theirs."""
    L, H = FAKE_CONFIG.n_layers, FAKE_CONFIG.n_heads
    halved = {"z": SiteChange(np.full((L, 1, H, 1), 0.5, np.float32), np.zeros((L, 1, H, 1)))}

    async def scenario():
        s = Scenario()
        blocker = await s.hold()
        readouts = [[ReadoutSelection()], [ReadoutSelection(changes=halved)]]
        work = [
            s.queue(ids(4)),
            s.queue(ids(4), attention=True),
            asyncio.ensure_future(s.engine.encode([ids(4)], readouts[0])),
            s.queue(ids(4)),
            asyncio.ensure_future(s.engine.encode([ids(4)], readouts[1])),
        ]
        await s.settle()
        s.release()
        results = await asyncio.gather(blocker, *work)
        return s.batches(), results

    batches, results = run(scenario)
    assert batches == [("embed", (2, 4)), ("attend", (1, 4)), ("read", (2, 4))]
    assert results[2][0].attention.weights.shape == (2, 2, 4, 4)
    assert results[1][0].attention is None and results[1][0].readouts is None
    kept, halved_out = results[3][0], results[5][0]
    assert kept.readouts is not None and kept.attention is None
    np.testing.assert_array_equal(kept.embeddings, results[1][0].embeddings)
    np.testing.assert_array_equal(halved_out.embeddings, kept.embeddings * 0.5)


def test_max_delay_holds_a_lone_sequence_until_company_or_time():
    async def scenario():
        clock = FakeClock()
        s = Scenario(clock=clock, max_delay_s=0.5)
        first = s.queue(ids(3))
        await clock.waiting.wait()  # the batcher holds it back...
        held = list(s.backend.calls)
        second = s.queue(ids(3))
        await s.settle()
        await clock.waiting.wait()  # ...and, with company but room for more, still waits
        still_held = list(s.backend.calls)
        clock.advance(0.5)  # until the oldest has waited max_delay
        await asyncio.gather(first, second)
        return held, still_held, s.backend.shapes()

    held, still_held, shapes = run(scenario)
    assert held == [] and still_held == []
    assert shapes == [("embed", (2, 3))]


def test_max_delay_ends_early_once_a_batch_is_full():
    async def scenario():
        clock = FakeClock()
        s = Scenario(clock=clock, max_delay_s=60, max_batch_size=2)
        results = await asyncio.gather(s.queue(ids(3)), s.queue(ids(3)))  # the clock never moves
        return s.backend.shapes(), results

    shapes, _ = run(scenario)
    assert shapes == [("embed", (2, 3))]


def test_a_deadline_that_passes_in_the_queue_fails_unrun():
    async def scenario():
        clock = FakeClock()
        s = Scenario(clock=clock)
        blocker = await s.hold()
        late = s.queue(ids(5, start=100), timeout=2.0)
        live = s.queue(ids(5))
        await s.settle()
        clock.advance(2.0)
        s.release()
        await blocker
        result = await live
        with pytest.raises(DeadlineExceededError, match=r"deadline passed while .* queued"):
            await late
        return s, result

    s, result = run(scenario)
    assert s.batches() == [("embed", (1, 5))]  # only the live one ran
    assert not any((call == 100).any() for _, call in s.backend.calls)
    assert result[0].embeddings.shape == (5, 4)
    assert s.metric("attnserve_expired_in_queue_total") == 1


def test_a_cancelled_request_leaves_the_queue_unrun():
    async def scenario():
        s = Scenario()
        blocker = await s.hold()
        request = s.queue(ids(5, start=100), ids(6, start=100))
        await s.settle()
        depth_before = s.engine.depth, s.metric("attnserve_queue_depth")
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        depth_after = s.engine.depth, s.metric("attnserve_queue_depth")
        s.release()
        await blocker
        await s.engine.stop()
        return s, depth_before, depth_after

    s, before, after = run(scenario)
    assert (before, after) == ((2, 2), (0, 0))  # the gauge reads the queue itself
    assert s.batches() == []


def test_admission_is_all_or_nothing():
    async def scenario():
        s = Scenario(max_queue=3)
        blocker = await s.hold()
        one = s.queue(ids(2))
        await s.settle()
        with pytest.raises(QueueFullError, match="1 sequences waiting, this request adds 3"):
            await s.engine.encode([ids(2), ids(2), ids(2)])
        depth = s.engine.depth
        s.release()
        await asyncio.gather(blocker, one)
        return s, depth

    s, depth = run(scenario)
    assert depth == 1  # nothing of the refused request was queued
    assert s.batches() == [("embed", (1, 2))]


def test_right_padding_gives_each_sequence_its_numbers_alone():
    lengths = [1, 7, 3, 12, 5, 12, 2]

    async def scenario():
        s = Scenario()
        blocker = await s.hold()
        sequences = [ids(n, start=3 * n) for n in lengths]
        batched = [s.queue(seq, attention=True) for seq in sequences]
        await s.settle()
        s.release()
        await blocker
        together = [(await b)[0] for b in batched]
        alone = [(await s.engine.encode([seq], [ALL_HEADS]))[0] for seq in sequences]
        return s, together, alone

    s, together, alone = run(scenario)
    assert len(s.batches()) < 2 * len(lengths)  # some really ran together, padded
    for n, a, b in zip(lengths, together, alone, strict=True):
        assert a.embeddings.shape == (n, 4) and a.attention.weights.shape == (2, 2, n, n)
        np.testing.assert_array_equal(a.embeddings, b.embeddings)
        np.testing.assert_array_equal(a.attention.weights, b.attention.weights)


def test_a_failed_batch_fails_its_requests_only_and_drops_their_other_sequences():
    async def scenario():
        s = Scenario(backend=FakeBackend(fail_on=99), max_batch_size=1)
        blocker = await s.hold()
        # The first sequence fails in the "model"; its sibling must leave the queue unrun.
        bad = s.queue(np.array([99, 1], dtype=np.int64), ids(3, start=100))
        good = s.queue(ids(4))
        await s.settle()
        s.release()
        await blocker
        with pytest.raises(InferenceError, match="fake ORT failure"):
            await bad
        return s, await good

    s, good = run(scenario)
    assert good[0].embeddings.shape == (4, 4)
    assert s.batches() == [("embed", (1, 2)), ("embed", (1, 4))]
    assert not any((call == 100).any() for _, call in s.backend.calls)


def test_stop_finishes_queued_work_then_refuses_new():
    async def scenario():
        s = Scenario()
        blocker = await s.hold()
        queued = s.queue(ids(4))
        await s.settle()
        stopping = asyncio.ensure_future(s.engine.stop())
        await s.settle()
        with pytest.raises(NotReadyError, match="shutting down"):
            await s.engine.encode([ids(2)])
        s.release()
        await stopping
        return await blocker, await queued

    _, queued = run(scenario)
    assert queued[0].embeddings.shape == (4, 4)


def test_a_lone_request_known_to_be_short_runs_on_the_event_loop():
    async def scenario():
        s = Scenario(inline_max_s=60.0)
        await s.engine.encode([ids(4)])  # its kind's cost is not known yet: the worker
        await s.engine.encode([ids(4)])  # alone and known to be short: here
        await s.engine.encode([ids(4)], [ALL_HEADS])  # attention's cost is not known yet
        assert s.backend.threads == ["backend_0", "MainThread", "backend_0"]

    run(scenario)


def test_requests_that_could_batch_or_run_long_keep_to_the_worker():
    async def scenario():
        s = Scenario(inline_max_s=60.0)
        await s.engine.encode([ids(4)])
        await s.engine.encode([ids(4), ids(4)])  # two sequences: a batch may form
        s.backend.gate.clear()
        blocker = s.queue(ids(4), attention=True)  # attention's cost is not known: the worker
        await asyncio.to_thread(s.backend.wait_calls, 3)
        queued = s.queue(ids(4))  # known to be short, but the model is busy: it queues
        await s.settle()
        s.release()
        await asyncio.gather(blocker, queued)
        quick = Scenario(inline_max_s=1e-12)  # no run is that short
        await quick.engine.encode([ids(4)])
        await quick.engine.encode([ids(4)])
        assert s.backend.threads == ["backend_0"] * 4
        assert quick.backend.threads == ["backend_0"] * 2

    run(scenario)
