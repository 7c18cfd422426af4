"""Dynamic batching: a bounded queue of sequences, batches formed under a token budget.

Requests put sequences on the queue; one loop forms batches of sequences of
similar length (so little padding is computed), right-pads them, runs ONNX
Runtime on a worker thread (off the event loop) and hands each sequence its
slice of the result. Right padding is exact for a causal model, so a sequence
gets the same numbers alone or inside any batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from service.errors import (
    AttnserveError,
    DeadlineExceededError,
    InferenceError,
    NotReadyError,
    QueueFullError,
)
from service.metrics import Metrics
from service.runtime import OrtRuntime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatcherOptions:
    max_batch_tokens: int = 4096  # batch size x longest sequence, per ORT call
    max_delay_s: float = 0.0  # how long the oldest sequence may wait for company
    max_queue: int = 256  # sequences waiting; more are refused at once
    max_batch_size: int = 0  # sequences per batch; 0: only the token budget limits; 1: no batching


@dataclass(frozen=True)
class SequenceResult:
    embeddings: np.ndarray  # (T, D)
    attentions: np.ndarray | None  # (L, H, T, T), only when asked for
    queue_ns: int  # time waiting for the batch
    inference_ns: int  # the batch's ORT call


@dataclass
class _Item:
    ids: np.ndarray  # (T,) int64
    with_attention: bool
    deadline: float | None  # time.monotonic() after which the work is useless
    future: asyncio.Future[SequenceResult]
    enqueued_ns: int = field(default_factory=time.perf_counter_ns)

    @property
    def length(self) -> int:
        return len(self.ids)


class Batcher:
    def __init__(self, runtime: OrtRuntime, options: BatcherOptions, metrics: Metrics) -> None:
        if options.max_batch_tokens < runtime.config.max_seq_len:
            raise ValueError(
                f"max_batch_tokens ({options.max_batch_tokens}) must be >= the model's "
                f"max_seq_len ({runtime.config.max_seq_len}) so that every sequence fits a batch"
            )
        self.runtime = runtime
        self.options = options
        self.metrics = metrics
        self._pending: list[_Item] = []
        self._arrived = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task | None = None
        # One worker: ORT already spreads a batch over the cores; two concurrent
        # batches would only fight for them.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ort")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="batcher")

    async def stop(self) -> None:
        """Refuse new work, finish everything queued, then stop the worker."""
        self._closing = True
        self._arrived.set()
        if self._task:
            await self._task
        self._executor.shutdown(wait=True)

    @property
    def depth(self) -> int:
        return len(self._pending)

    def submit(
        self, sequences: list[np.ndarray], with_attention: bool, deadline: float | None
    ) -> list[asyncio.Future[SequenceResult]]:
        """Queue all sequences of one request, or none of them (QueueFullError)."""
        if self._closing:
            raise NotReadyError("the server is shutting down; retry on another replica")
        if len(self._pending) + len(sequences) > self.options.max_queue:
            raise QueueFullError(
                f"queue full: {len(self._pending)} sequences waiting, this request adds "
                f"{len(sequences)}, the limit is {self.options.max_queue}; retry with backoff"
            )
        loop = asyncio.get_running_loop()
        items = [_Item(ids, with_attention, deadline, loop.create_future()) for ids in sequences]
        self._pending.extend(items)
        self.metrics.queue_depth.set(len(self._pending))
        self._arrived.set()
        return [item.future for item in items]

    async def _run(self) -> None:
        while self._pending or not self._closing:
            if not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            waited = (time.perf_counter_ns() - self._pending[0].enqueued_ns) / 1e9
            pending_tokens = sum(item.length for item in self._pending)
            if (
                waited < self.options.max_delay_s
                and pending_tokens < self.options.max_batch_tokens
                and not self._closing
            ):
                # Give the oldest sequence a little time to gather company.
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), self.options.max_delay_s - waited)
                continue
            batch = self._take_batch()
            if batch:
                await self._execute(batch)

    def _take_batch(self) -> list[_Item]:
        """The oldest live sequence plus those closest to it in length, under the budget."""
        now = time.monotonic()
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
        if not live:
            self._pending = []
            self.metrics.queue_depth.set(0)
            return []
        oldest = live[0]
        similar = sorted(
            (i for i in live[1:] if i.with_attention == oldest.with_attention),
            key=lambda i: abs(i.length - oldest.length),
        )
        batch, longest = [oldest], oldest.length
        for item in similar:
            if len(batch) == self.options.max_batch_size:
                break
            new_longest = max(longest, item.length)
            if new_longest * (len(batch) + 1) > self.options.max_batch_tokens:
                continue
            batch.append(item)
            longest = new_longest
        chosen = {id(i) for i in batch}
        self._pending = [i for i in live if id(i) not in chosen]
        self.metrics.queue_depth.set(len(self._pending))
        return batch

    async def _execute(self, batch: list[_Item]) -> None:
        config = self.runtime.config
        longest = max(item.length for item in batch)
        ids = np.full((len(batch), longest), config.pad_id, dtype=np.int64)
        for row, item in enumerate(batch):
            ids[row, : item.length] = item.ids  # right padding: exact for a causal model
        with_attention = batch[0].with_attention
        start = time.perf_counter_ns()
        loop = asyncio.get_running_loop()
        try:
            if with_attention:
                embeddings, attentions = await loop.run_in_executor(
                    self._executor, self.runtime.run, ids
                )
            else:
                embeddings = await loop.run_in_executor(self._executor, self.runtime.embed, ids)
                attentions = None
        except AttnserveError as exc:
            log.error("batch of %d sequences (%s) failed: %s", len(batch), ids.shape, exc)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
            return
        except Exception as exc:  # a bug, not ORT: still answer every caller
            log.exception("batch of %d sequences (%s) failed", len(batch), ids.shape)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(InferenceError(f"batch failed: {exc}"))
            return
        inference_ns = time.perf_counter_ns() - start

        m = self.metrics
        m.inference_time.observe(inference_ns / 1e9)
        m.batch_size.observe(len(batch))
        m.batch_tokens.observe(ids.size)
        m.sequences.inc(len(batch))
        m.tokens.inc(sum(item.length for item in batch))
        for row, item in enumerate(batch):
            n = item.length
            queue_ns = start - item.enqueued_ns
            m.queue_time.observe(queue_ns / 1e9)
            if item.future.done():
                continue
            item.future.set_result(
                SequenceResult(
                    embeddings=embeddings[row, :n],
                    attentions=attentions[row, :, :, :n, :n] if attentions is not None else None,
                    queue_ns=queue_ns,
                    inference_ns=inference_ns,
                )
            )
