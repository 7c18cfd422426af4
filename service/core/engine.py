"""One engine per model: the loop that owns the model's cores and decides what runs next.

Two kinds of work share the cores: Encode batches (core/batching.py forms them) and the
pieces of generation (service/generate/scheduler.py: a decode step of the running texts,
or a chunk of a prompt). Every piece is short, and one place picks the next, so an Encode
that arrives while texts generate waits for one piece, not for the texts, and texts go on
between Encodes. While both kinds wait, each gets its share of the time the cores spend
(GENERATION_SHARE: start-time fair queueing, by the seconds each piece took): a kind that
was idle starts level with the other, so it neither waits nor builds up credit.

The cores are used the way Triton's instance groups use them. A piece that runs alone runs
on the main backend, which has every core; when more Encodes wait, their batches run side
by side on the narrow `instances` (one thread each), which beats one session whose threads
synchronise at every operator. The two never overlap, and generation runs on the main
backend's thread only.

The policy's clock is injected: tests drive `max_delay_s`, deadlines and the shares with a
fake one instead of sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from attnserve.service.core.backend import Backend, ReadoutSelection
from attnserve.service.core.batching import (
    DEFAULT_BATCH_TOKENS,
    BatcherOptions,
    Clock,
    EncodeItem,
    EncodeQueue,
    MonotonicClock,
    Selection,
    SequenceResult,
    answer,
    padded_ids,
)
from attnserve.service.core.errors import (
    AttnserveError,
    InferenceError,
    ModelLoadError,
    NotReadyError,
)
from attnserve.service.core.metrics import ModelMetrics
from attnserve.service.generate.output import Made
from attnserve.service.generate.plan import GenerationPlan
from attnserve.service.generate.scheduler import Generation, Work

log = logging.getLogger(__name__)

ENCODE, GENERATE, GRAPH = "encode", "generate", "graph"
# Each kind's weight while others wait too: generation 0.65 of the cores against Encodes'
# 0.35; an attribution graph's backward passes, minutes of work, weigh as Encodes do.
SHARES = {ENCODE: 0.35, GENERATE: 0.65, GRAPH: 0.35}
GENERATION_SHARE = SHARES[GENERATE]


@dataclass(eq=False)
class _Step:
    """One step of a long job (an attribution graph's: service/circuits/attribute.py) to
    run on the wide lane: next(steps) there, its answer (a step's yield, or the value it
    returns at its end) into `future`."""

    steps: Generator[Any, None, Any]
    future: asyncio.Future[Any]
    ended: bool = False  # the value the job returns
    running: bool = False  # inside the lane's thread now
    close_after: bool = False  # its caller left while it ran: the job ends after it

    def run(self) -> Any:
        try:
            return next(self.steps)
        except StopIteration as stop:
            self.ended = True
            return stop.value


@dataclass(eq=False)
class _Lane:
    """One backend and the one thread that runs it; busy while a piece is inside."""

    backend: Backend
    executor: ThreadPoolExecutor
    busy: bool = False


class Engine:
    def __init__(
        self,
        backend: Backend,
        options: BatcherOptions,
        metrics: ModelMetrics,
        clock: Clock | None = None,
        instances: Sequence[Backend] = (),
    ) -> None:
        """`backend` runs a piece when it is the only one; `instances` (copies of the same
        model, a thread each) run Encode batches side by side when more wait."""
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
        self.encodes = EncodeQueue(options, self.clock, metrics)
        self.generation = Generation(backend, on_token=metrics.generated_tokens.inc)
        # Each kind's recent backend seconds per real token (a moving average): the cost
        # model of inline runs.
        self._seconds_per_token: dict[type | None, float] = {}
        # start-time fair queueing: each kind's used seconds over its share
        self._virtual = dict.fromkeys(SHARES, 0.0)
        self._steps: deque[_Step] = deque()  # long jobs' next steps, oldest first
        self._arrived = asyncio.Event()
        self._lane_freed = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._wide = _Lane(backend, _one_thread("backend"))
        self._narrow = [_Lane(b, _one_thread(f"instance{i}")) for i, b in enumerate(instances)]
        metrics.queue_depth.set_function(lambda: self.depth)

    @property
    def _lanes(self) -> list[_Lane]:
        return [self._wide, *self._narrow]

    @property
    def depth(self) -> int:
        """Sequences waiting for a batch."""
        return len(self.encodes.pending)

    @property
    def generating(self) -> int:
        """Texts in the running batch."""
        return len(self.generation.running)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="engine")

    async def stop(self, reason: str = "the server is shutting down") -> None:
        """Refuse new work, finish the Encodes queued, end the texts still being made with
        NotReadyError(reason), then stop the workers."""
        self._closing = True
        self._arrived.set()
        if self._task:
            await self._task
        await asyncio.gather(*self._running)
        self.generation.fail(NotReadyError(reason))
        while self._steps:
            self._steps.popleft().future.set_exception(NotReadyError(reason))
        for lane in self._lanes:
            lane.executor.shutdown(wait=True)

    def stop_generating(self, reason: str) -> None:
        """End the texts being made with NotReadyError(reason) (the drain's grace is over);
        Encodes go on."""
        self.generation.fail(NotReadyError(reason))

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

    async def encode(
        self,
        sequences: list[np.ndarray],
        selections: Sequence[Selection] | None = None,
        timeout: float | None = None,
    ) -> list[SequenceResult]:
        """Run every sequence (validated int64 ids) and return their results in order.

        `selections`: one per sequence (attention, or readouts), or None for embeddings
        only. All are queued or none (QueueFullError). If one fails, or the caller is
        cancelled, the request's other sequences leave the queue unrun. `timeout`: seconds
        from now after which queued work is dropped unrun (DeadlineExceededError).
        """
        if self._closing:
            raise NotReadyError("the server is shutting down; retry on another replica")
        items = self.encodes.admit(sequences, selections, timeout)
        if self._runs_inline(items):
            lane = self._wide
            lane.busy = True
            try:  # no await inside: nothing can cancel it halfway
                await self._run_batch(items, lane.backend, None)
            finally:
                self._free(lane)
            return [item.future.result() for item in items]
        self.encodes.pending += items
        self._arrived.set()
        try:
            return list(await asyncio.gather(*(item.future for item in items)))
        except BaseException:
            for item in items:  # no-op on those already answered
                item.future.cancel()
            self.encodes.drop_dead()
            raise

    async def generate(self, plan: GenerationPlan) -> AsyncGenerator[Made, None]:
        """The text's chosen tokens as they are made; leaving the iteration early (the
        client went away, or a stop string) takes the text out of the batch at the next
        piece."""
        if self._closing:
            raise NotReadyError("the server is shutting down; retry on another replica")
        text = self.generation.submit(plan)
        self._arrived.set()
        try:
            while True:
                item = await text.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.reason is not None:
                    return
        finally:
            text.ended = True
            self._arrived.set()

    async def run_steps(self, steps: Generator[Any, None, Any]) -> AsyncGenerator[Any, None]:
        """A long job's steps run one at a time on every core, between the other kinds'
        pieces: what each yields, then what it returns. A step runs when the caller asks
        for the next, so it paces the job; leaving the iteration closes the job (once its
        running step, if any, is done)."""
        if self._closing:
            raise NotReadyError("the server is shutting down; retry on another replica")
        step: _Step | None = None
        try:
            while True:
                step = _Step(steps, asyncio.get_running_loop().create_future())
                self._steps.append(step)
                self._arrived.set()
                answer = await step.future
                ended, step = step.ended, None
                yield answer
                if ended:
                    return
        finally:
            if step is not None and step in self._steps:  # not started: it never runs
                self._steps.remove(step)
            if step is not None and step.running:  # closed by the lane once it is done
                step.close_after = True
            else:
                steps.close()

    def _runs_inline(self, items: list[EncodeItem]) -> bool:
        """Whether a request runs at once on the event loop: one sequence, nothing queued,
        running or generating (so no batch could form and no lane waits on the loop),
        expected to be short."""
        if len(items) != 1 or self.encodes.pending or any(lane.busy for lane in self._lanes):
            return False
        if self.generation.has_work or self._steps:
            return False
        per_token = self._seconds_per_token.get(items[0].kind)
        return per_token is not None and items[0].length * per_token <= self.options.inline_max_s

    async def _loop(self) -> None:
        encodes = self.encodes
        while encodes.pending or not self._closing:
            encodes.drop_dead()
            generate = self.generation.has_work and not self._closing
            wait = encodes.time_to_wait(self._closing) if encodes.pending else 0.0
            encode = bool(encodes.pending) and wait <= 0
            waiting = {ENCODE: encode, GENERATE: generate, GRAPH: bool(self._steps)}
            if not any(waiting.values()):
                self._arrived.clear()
                if encodes.pending:  # give the oldest sequence a little time for company
                    await self.clock.wait(self._arrived, wait)
                else:
                    await self._arrived.wait()
                continue
            kind = self._next_kind({k for k, w in waiting.items() if w})
            if kind != ENCODE:
                if any(lane.busy for lane in self._lanes):  # it needs every core
                    await self._lane_free()
                    continue
                if kind == GENERATE:
                    await self._run_generation(self.generation.next_work(bool(encodes.pending)))
                else:
                    await self._run_step(self._steps.popleft())
                continue
            if not self._can_start():
                await self._lane_free()
                continue
            batch = encodes.take_batch()
            lane = self._choose_lane()
            lane.busy = True
            task = asyncio.get_running_loop().create_task(self._execute(batch, lane))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    def _next_kind(self, waiting: set[str]) -> str:
        """Which of the waiting kinds runs next: the one furthest behind its share (Encodes
        first, then generation, on a tie); an idle kind starts level with the waiting."""
        level = min(self._virtual[kind] for kind in waiting)
        for idle in SHARES.keys() - waiting:
            self._virtual[idle] = max(self._virtual[idle], level)
        return min((k for k in SHARES if k in waiting), key=self._virtual.__getitem__)

    def _charge(self, kind: str, seconds: float) -> None:
        self._virtual[kind] += seconds / SHARES[kind]

    async def _run_step(self, step: _Step) -> None:
        """One step of a long job on the wide lane; its failure is its caller's."""
        lane = self._wide
        lane.busy = step.running = True
        start = self.clock.now()
        try:
            answer = await asyncio.get_running_loop().run_in_executor(lane.executor, step.run)
            if not step.future.done():  # (cancelled: its caller left)
                step.future.set_result(answer)
        except Exception as exc:
            if not isinstance(exc, AttnserveError):
                log.exception("a step of a long job failed")
                exc = InferenceError(f"the job failed: {exc}")
            if not step.future.done():
                step.future.set_exception(exc)
        finally:
            step.running = False
            if step.close_after:
                step.steps.close()
            self._charge(GRAPH, self.clock.now() - start)
            self._free(lane)

    async def _lane_free(self) -> None:
        self._lane_freed.clear()
        await self._lane_freed.wait()

    def _can_start(self) -> bool:
        """The wide backend is idle, and so is a narrow lane (if there are any)."""
        if self._wide.busy:
            return False
        return not self._narrow or not all(lane.busy for lane in self._narrow)

    def _choose_lane(self) -> _Lane:
        """Every core for a batch that runs alone; a narrow lane while others run or wait."""
        idle_narrow = [lane for lane in self._narrow if not lane.busy]
        alone = len(idle_narrow) == len(self._narrow) and not self.encodes.pending
        return self._wide if alone or not idle_narrow else idle_narrow[0]

    def _free(self, lane: _Lane) -> None:
        lane.busy = False
        self._lane_freed.set()

    async def _run_generation(self, work: Work) -> None:
        """One piece of generation on the wide lane; a failure ends every text."""
        lane = self._wide
        lane.busy = True
        start = self.clock.now()
        try:
            result = await asyncio.get_running_loop().run_in_executor(lane.executor, work.run)
            work.finish(result)
        except Exception as exc:  # the model failed: every text being made fails with it
            log.exception("generation failed")
            self.generation.fail(exc)
        finally:
            self._charge(GENERATE, self.clock.now() - start)
            self._free(lane)
        await asyncio.sleep(0)  # let the streams send what they were given

    async def _execute(self, batch: list[EncodeItem], lane: _Lane) -> None:
        """Run one batch on `lane` and answer its sequences; never raises."""
        try:
            await self._run_batch(batch, lane.backend, lane.executor)
        finally:
            self._free(lane)

    async def _run_batch(
        self, batch: list[EncodeItem], backend: Backend, executor: ThreadPoolExecutor | None
    ) -> None:
        """Run one batch (on `executor`'s thread; None: here, on the event loop) and answer
        its sequences."""
        ids = padded_ids(batch, backend.config.pad_id)
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
            self._fail_batch(batch, ids, exc)
            return
        finally:  # a narrow lane holds one core of several
            lanes = 1 if executor in (None, self._wide.executor) else len(self._narrow)
            self._charge(ENCODE, (self.clock.now() - start) / lanes)
        self._count(batch, ids, inference_s, start)
        answer(batch, outputs, inference_s, start)

    def _fail_batch(self, batch: list[EncodeItem], ids: np.ndarray, exc: Exception) -> None:
        if isinstance(exc, AttnserveError):
            log.error("batch of %d sequences %s failed: %s", len(batch), ids.shape, exc)
        else:  # a bug, not the model: still answer every caller
            log.exception("batch of %d sequences %s failed", len(batch), ids.shape)
            exc = InferenceError(f"batch failed: {exc}")
        for item in batch:
            if not item.future.done():
                item.future.set_exception(exc)
        # The failed requests' other sequences would be wasted work: drop them now, before
        # the next batch forms (their callers have not run yet).
        self.encodes.forget({item.request for item in batch})

    def _count(
        self, batch: list[EncodeItem], ids: np.ndarray, inference_s: float, start: float
    ) -> None:
        kind = batch[0].kind
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
        for item in batch:
            m.queue_time.observe(start - item.enqueued)


def _one_thread(name: str) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)


def _timed(run: Callable[[], Any]) -> tuple[Any, float]:
    """On the worker thread: what `run` returns, and the seconds the backend call itself
    took (without the hand-offs to and from the thread)."""
    start = time.perf_counter()
    return run(), time.perf_counter() - start
