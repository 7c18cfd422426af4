"""Dynamic batching: a bounded queue of sequences, batches formed where they pay.

`await batcher.encode(sequences, ...)` queues all of a request's sequences (or
none: admission is all or nothing) and returns their results in order. One loop
forms batches: the oldest sequence plus those closest to it in length, of the
same kind (embeddings only, with attention, or with readouts), under the token budget; it right-pads
them, runs the backend on a worker thread (off the event loop) and hands each
sequence its slice. Right padding is exact for a causal model, so a sequence
gets the same numbers alone or inside any batch.

Batching is cost-aware. On a CPU a batch wins only by making small matrix
products bigger: short sequences batch, long ones (`max_batched_seq_len`) run
alone, and a sequence joins a batch only while the padding stays small
(`max_padding`): a padded batch pays for its longest row in every row.

Model instances use the cores the way Triton's instance groups do. A lone batch
runs on the main backend, which has every core; when more work waits, batches run
side by side on the narrow `instances` (one thread each), which beats one
session whose threads synchronise at every operator. The two never overlap.

The policy's clock is injected: tests drive `max_delay_s` and deadlines with a
fake one instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

import numpy as np

from attnserve.service.core.backend import (
    AttentionOutput,
    AttentionSelection,
    Backend,
    ReadoutOutput,
    ReadoutSelection,
)
from attnserve.service.core.errors import (
    AttnserveError,
    DeadlineExceededError,
    InferenceError,
    ModelLoadError,
    NotReadyError,
    QueueFullError,
)
from attnserve.service.core.metrics import ModelMetrics

log = logging.getLogger(__name__)


Selection = AttentionSelection | ReadoutSelection  # what a sequence asks besides embeddings


# The batch token budget where none is set: this, or the model's context if longer.
DEFAULT_BATCH_TOKENS = 4096


@dataclass(frozen=True)
class BatcherOptions:
    # batch size x longest sequence, per backend call; 0: DEFAULT_BATCH_TOKENS, or the
    # model's max_seq_len where that is longer (a model exported for 8k tokens serves them)
    max_batch_tokens: int = 0
    max_delay_s: float = 0.0  # how long the oldest sequence may wait for company
    max_queue: int = 256  # sequences waiting; more are refused at once
    max_batch_size: int = 0  # sequences per batch; 0: only the token budget limits; 1: no batching
    # Longer sequences run alone: from about 64 tokens on, the model's matrix products are
    # big enough that a batch saves nothing on one thread, and padding only costs.
    max_batched_seq_len: int = 32
    # A sequence joins a batch only while padding stays within this share of the real tokens.
    max_padding: float = 0.25
    # A lone request (every lane idle, nothing queued) that the last runs of its kind say
    # takes at most this long runs on the event loop itself: the hand-off to a worker
    # thread and back costs 3-13% of a run here, and with the main lane busy nothing else
    # could run meanwhile anyway. The bound keeps the loop responsive, and it keeps load
    # visible: requests that arrive during a run on the loop wait unseen, so each finds the
    # queue empty and runs inline in turn, one at a time on the main lane while the
    # instances idle (a saturated 8..512-token mix with a 50 ms bound, which let every
    # length inline here: 1.15x fewer tokens/s; short runs alone gain from inline). 0: never.
    inline_max_s: float = 0.01

    def __post_init__(self) -> None:
        if self.max_batch_tokens < 0:
            raise ValueError(f"max_batch_tokens must be >= 0, got {self.max_batch_tokens}")
        if self.max_batched_seq_len < 1:
            raise ValueError(f"max_batched_seq_len must be >= 1, got {self.max_batched_seq_len}")
        if self.max_padding < 0:
            raise ValueError(f"max_padding must be >= 0, got {self.max_padding}")


@dataclass(frozen=True)
class SequenceResult:
    embeddings: np.ndarray  # (T, D)
    attention: AttentionOutput | None  # only when asked for
    queue_ns: int  # time waiting for the batch
    inference_ns: int  # the batch's backend call
    readouts: ReadoutOutput | None = None  # only when asked for


class Clock(Protocol):
    """The batcher's sense of time (seconds on a monotonic clock)."""

    def now(self) -> float: ...

    async def wait(self, event: asyncio.Event, timeout: float) -> None:
        """Return when `event` is set or `timeout` seconds have passed, whichever is first."""


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    async def wait(self, event: asyncio.Event, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)


@dataclass(eq=False)
class _Item:
    ids: np.ndarray  # (T,) int64
    selection: Selection | None  # None: embeddings only
    deadline: float | None  # clock time after which the work is useless
    enqueued: float  # clock time
    future: asyncio.Future[SequenceResult]
    request: object  # shared by the sequences of one encode() call

    @property
    def length(self) -> int:
        return len(self.ids)

    @property
    def kind(self) -> type | None:
        """Which backend call runs it: sequences of one kind batch together."""
        return type(self.selection) if self.selection is not None else None


@dataclass(eq=False)
class _Lane:
    """One backend and the one thread that runs it; busy while a batch is inside."""

    backend: Backend
    executor: ThreadPoolExecutor
    busy: bool = False


class Batcher:
    def __init__(
        self,
        backend: Backend,
        options: BatcherOptions,
        metrics: ModelMetrics,
        clock: Clock | None = None,
        instances: Sequence[Backend] = (),
    ) -> None:
        """`backend` runs a batch when it is the only one; `instances` (copies of the same
        model, a thread each) run batches side by side when more work waits."""
        context = backend.config.max_seq_len
        if not options.max_batch_tokens:
            options = replace(options, max_batch_tokens=max(DEFAULT_BATCH_TOKENS, context))
        elif options.max_batch_tokens < context:
            raise ModelLoadError(
                f"--max-batch-tokens {options.max_batch_tokens} cannot hold one sequence of "
                f"{backend.config.name} (max_seq_len {context}): set it to at least {context}, "
                "or 0 for the model's own"
            )
        self.backend = backend
        self.options = options
        self.metrics = metrics
        self.clock = clock or MonotonicClock()
        self._pending: list[_Item] = []
        # Each kind's recent backend seconds per real token (a moving average): the cost
        # model of inline runs.
        self._seconds_per_token: dict[type | None, float] = {}
        self._arrived = asyncio.Event()
        self._lane_freed = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()
        self._wide = _Lane(backend, _one_thread("backend"))
        self._narrow = [_Lane(b, _one_thread(f"instance{i}")) for i, b in enumerate(instances)]
        metrics.queue_depth.set_function(lambda: self.depth)

    @property
    def _lanes(self) -> list[_Lane]:
        return [self._wide, *self._narrow]

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="batcher")

    async def stop(self) -> None:
        """Refuse new work, finish everything queued, then stop the workers."""
        self._closing = True
        self._arrived.set()
        if self._task:
            await self._task
        await asyncio.gather(*self._running)
        for lane in self._lanes:
            lane.executor.shutdown(wait=True)

    async def warm_up(self) -> None:
        """Warm every backend on its own thread (first requests skip allocation and setup)."""
        loop = asyncio.get_running_loop()
        for lane in self._lanes:
            await loop.run_in_executor(lane.executor, lane.backend.warmup)

    async def release_memory(self) -> None:
        """On each idle backend's own thread, let it give freed memory back."""
        for lane in self._lanes:
            if self._closing or lane.busy:  # a busy one is asked after the next burst
                continue
            lane.busy = True
            try:
                await asyncio.get_running_loop().run_in_executor(
                    lane.executor, lane.backend.release_memory
                )
            except Exception:  # only memory stays high; requests are not affected
                log.exception("giving memory back failed")
            finally:
                self._free(lane)

    @property
    def depth(self) -> int:
        """Sequences waiting for a batch."""
        return len(self._pending)

    async def encode(
        self,
        sequences: list[np.ndarray],
        selections: Sequence[Selection] | None = None,
        timeout: float | None = None,
    ) -> list[SequenceResult]:
        """Run every sequence (validated int64 ids) and return their results in order.

        `selections`: one per sequence (attention, or readouts), or None for embeddings
        only.

        All are queued or none (QueueFullError). If one fails, or the caller is
        cancelled, the request's other sequences leave the queue unrun.
        `timeout`: seconds from now after which queued work is dropped unrun
        (DeadlineExceededError).
        """
        items = self._admit(sequences, selections, timeout)
        if self._runs_inline(items):
            lane = self._wide
            lane.busy = True
            try:  # no await inside: nothing can cancel it halfway
                await self._run_batch(items, lane.backend, None)
            finally:
                self._free(lane)
            return [item.future.result() for item in items]
        self._pending += items
        self._arrived.set()
        try:
            return list(await asyncio.gather(*(item.future for item in items)))
        except BaseException:
            for item in items:  # no-op on those already answered
                item.future.cancel()
            self._pending = [i for i in self._pending if not i.future.done()]
            raise

    def _admit(
        self,
        sequences: list[np.ndarray],
        selections: Sequence[Selection] | None,
        timeout: float | None,
    ) -> list[_Item]:
        if self._closing:
            raise NotReadyError("the server is shutting down; retry on another replica")
        if len(self._pending) + len(sequences) > self.options.max_queue:
            raise QueueFullError(
                f"queue full: {len(self._pending)} sequences waiting, this request adds "
                f"{len(sequences)}, the limit is {self.options.max_queue}; retry with backoff"
            )
        now = self.clock.now()
        deadline = None if timeout is None else now + timeout
        loop = asyncio.get_running_loop()
        request = object()
        chosen: Sequence[Selection | None] = selections or [None] * len(sequences)
        items = [
            _Item(ids, selection, deadline, now, loop.create_future(), request)
            for ids, selection in zip(sequences, chosen, strict=True)
        ]
        return items

    def _runs_inline(self, items: list[_Item]) -> bool:
        """Whether a request runs at once on the event loop: one sequence, nothing queued or
        running (so no batch could form and no lane waits on the loop), expected to be short."""
        if len(items) != 1 or self._pending or any(lane.busy for lane in self._lanes):
            return False
        per_token = self._seconds_per_token.get(items[0].kind)
        return per_token is not None and items[0].length * per_token <= self.options.inline_max_s

    async def _loop(self) -> None:
        while self._pending or not self._closing:
            self._drop_dead()
            if not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            wait = self._time_to_wait()
            if wait > 0:  # give the oldest sequence a little time to gather company
                self._arrived.clear()
                await self.clock.wait(self._arrived, wait)
                continue
            if not self._can_start():
                self._lane_freed.clear()
                await self._lane_freed.wait()
                continue
            batch = self._take_batch()
            lane = self._choose_lane()
            lane.busy = True
            task = asyncio.get_running_loop().create_task(self._execute(batch, lane))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    def _can_start(self) -> bool:
        """The wide backend is idle, and so is a narrow lane (if there are any)."""
        if self._wide.busy:
            return False
        return not self._narrow or not all(lane.busy for lane in self._narrow)

    def _choose_lane(self) -> _Lane:
        """Every core for a batch that runs alone; a narrow lane while others run or wait."""
        idle_narrow = [lane for lane in self._narrow if not lane.busy]
        alone = len(idle_narrow) == len(self._narrow) and not self._pending
        return self._wide if alone or not idle_narrow else idle_narrow[0]

    def _free(self, lane: _Lane) -> None:
        lane.busy = False
        self._lane_freed.set()

    def _drop_dead(self) -> None:
        """Forget cancelled sequences; fail those whose deadline passed, unrun."""
        now = self.clock.now()
        live = []
        for item in self._pending:
            if item.future.done():  # the caller went away (cancelled)
                continue
            if item.deadline is not None and now >= item.deadline:
                self.metrics.expired.inc()
                item.future.set_exception(
                    DeadlineExceededError("the deadline passed while the request was queued")
                )
                continue
            live.append(item)
        self._pending = live

    def _time_to_wait(self) -> float:
        """Seconds the oldest sequence should still wait for company (<= 0: run now)."""
        if self._closing or self.options.max_delay_s <= 0:
            return 0.0
        oldest = self._pending[0]
        if oldest.length > self.options.max_batched_seq_len:
            return 0.0  # it runs alone: company would not join it
        kin = [i for i in self._pending if i.kind == oldest.kind]
        full_by_count = 0 < self.options.max_batch_size <= len(kin)
        full_by_tokens = max(i.length for i in kin) * len(kin) >= self.options.max_batch_tokens
        if full_by_count or full_by_tokens:
            return 0.0
        return oldest.enqueued + self.options.max_delay_s - self.clock.now()

    def _take_batch(self) -> list[_Item]:
        """The oldest sequence plus those of its kind closest to it in length, under budget:
        only short sequences share a batch, and only while padding stays small."""
        oldest = self._pending[0]
        batch, longest, real = [oldest], oldest.length, oldest.length
        if oldest.length <= self.options.max_batched_seq_len:
            similar = sorted(
                (
                    i
                    for i in self._pending[1:]
                    if i.kind == oldest.kind and i.length <= self.options.max_batched_seq_len
                ),
                key=lambda i: abs(i.length - oldest.length),
            )
            for item in similar:
                if len(batch) == self.options.max_batch_size:
                    break
                new_longest = max(longest, item.length)
                padded, new_real = new_longest * (len(batch) + 1), real + item.length
                if padded > self.options.max_batch_tokens:
                    continue
                if padded > (1 + self.options.max_padding) * new_real:
                    continue
                batch.append(item)
                longest, real = new_longest, new_real
        chosen = set(map(id, batch))
        self._pending = [i for i in self._pending if id(i) not in chosen]
        return batch

    async def _execute(self, batch: list[_Item], lane: _Lane) -> None:
        """Run one batch on `lane` and answer its sequences; never raises."""
        try:
            await self._run_batch(batch, lane.backend, lane.executor)
        finally:
            self._free(lane)

    async def _run_batch(
        self, batch: list[_Item], backend: Backend, executor: ThreadPoolExecutor | None
    ) -> None:
        """Run one batch (on `executor`'s thread; None: here, on the event loop) and answer
        its sequences."""
        config = backend.config
        longest = max(item.length for item in batch)
        ids = np.full((len(batch), longest), config.pad_id, dtype=np.int64)
        for row, item in enumerate(batch):
            ids[row, : item.length] = item.ids  # right padding: exact for a causal model
        kind = batch[0].kind
        start = self.clock.now()
        run: Callable[[], Any] = partial(backend.embed, ids)
        if kind is not None:  # one kind per batch: every selection is of that type
            lengths = [item.length for item in batch]
            selections: list[Any] = [item.selection for item in batch]
            call = backend.read if kind is ReadoutSelection else backend.attend
            run = partial(call, ids, lengths, selections)
        try:
            if executor is None:
                outputs, inference_s = _timed(run)
            else:
                outputs, inference_s = await asyncio.get_running_loop().run_in_executor(
                    executor, _timed, run
                )
        except Exception as exc:
            if isinstance(exc, AttnserveError):
                log.error("batch of %d sequences %s failed: %s", len(batch), ids.shape, exc)
            else:  # a bug, not the model: still answer every caller
                log.exception("batch of %d sequences %s failed", len(batch), ids.shape)
                exc = InferenceError(f"batch failed: {exc}")
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
            # The failed requests' other sequences would be wasted work: drop them now,
            # before the next batch forms (their callers have not run yet).
            failed = {item.request for item in batch}
            for item in self._pending:
                if item.request in failed:
                    item.future.cancel()
            return
        embeddings, extras = outputs if kind is not None else (outputs, [None] * len(batch))

        tokens = sum(item.length for item in batch)
        last = self._seconds_per_token.get(kind)
        now = inference_s / tokens
        self._seconds_per_token[kind] = now if last is None else 0.8 * last + 0.2 * now
        m = self.metrics
        m.inference_time.observe(inference_s)
        m.batch_size.observe(len(batch))
        m.batch_tokens.observe(ids.size)
        m.sequences.inc(len(batch))
        m.tokens.inc(tokens)
        for row, item in enumerate(batch):
            n = item.length
            queue_s = start - item.enqueued
            m.queue_time.observe(queue_s)
            if item.future.done():
                continue
            extra = extras[row]
            readouts = extra if isinstance(extra, ReadoutOutput) else None
            item.future.set_result(
                SequenceResult(
                    embeddings=embeddings[row, :n],
                    attention=readouts.attention if readouts else extra,
                    queue_ns=int(queue_s * 1e9),
                    inference_ns=int(inference_s * 1e9),
                    readouts=readouts,
                )
            )


def _one_thread(name: str) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)


def _timed(run: Callable[[], Any]) -> tuple[Any, float]:
    """On the worker thread: what `run` returns, and the seconds the backend call itself
    took (without the hand-offs to and from the thread)."""
    start = time.perf_counter()
    return run(), time.perf_counter() - start
