"""Dynamic batching of Encodes: a bounded queue of sequences, batches formed where they pay.

A request's sequences are queued all or none. A batch is the oldest sequence plus those
closest to it in length, of the same kind (embeddings only, with attention, or with
readouts), under the token budget; the engine (core/engine.py) right-pads and runs it and
hands each sequence its slice. Right padding is exact for a causal model, so a sequence
gets the same numbers alone or inside any batch.

Batching is cost-aware. On a CPU a batch wins only by making small matrix products bigger:
short sequences batch, long ones (`max_batched_seq_len`) run alone, and a sequence joins a
batch only while the padding stays small (`max_padding`): a padded batch pays for its
longest row in every row.

The policy's clock is injected: tests drive `max_delay_s` and deadlines with a fake one
instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from attnserve.service.core.backend import (
    AttentionOutput,
    AttentionSelection,
    ReadoutOutput,
    ReadoutSelection,
)
from attnserve.service.core.errors import DeadlineExceededError, QueueFullError
from attnserve.service.core.metrics import ModelMetrics

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
class EncodeItem:
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


class EncodeQueue:
    """The Encode sequences waiting for a batch, and the policy that forms batches."""

    def __init__(self, options: BatcherOptions, clock: Clock, metrics: ModelMetrics) -> None:
        self.options = options
        self.clock = clock
        self.metrics = metrics
        self.pending: list[EncodeItem] = []

    def admit(
        self,
        sequences: list[np.ndarray],
        selections: Sequence[Selection] | None,
        timeout: float | None,
    ) -> list[EncodeItem]:
        """A request's sequences as items (not queued yet), or QueueFullError for all."""
        if len(self.pending) + len(sequences) > self.options.max_queue:
            raise QueueFullError(
                f"queue full: {len(self.pending)} sequences waiting, this request adds "
                f"{len(sequences)}, the limit is {self.options.max_queue}; retry with backoff"
            )
        now = self.clock.now()
        deadline = None if timeout is None else now + timeout
        loop = asyncio.get_running_loop()
        request = object()
        chosen: Sequence[Selection | None] = selections or [None] * len(sequences)
        return [
            EncodeItem(ids, selection, deadline, now, loop.create_future(), request)
            for ids, selection in zip(sequences, chosen, strict=True)
        ]

    def drop_dead(self) -> None:
        """Forget cancelled sequences; fail those whose deadline passed, unrun."""
        now = self.clock.now()
        live = []
        for item in self.pending:
            if item.future.done():  # the caller went away (cancelled)
                continue
            if item.deadline is not None and now >= item.deadline:
                self.metrics.expired.inc()
                item.future.set_exception(
                    DeadlineExceededError("the deadline passed while the request was queued")
                )
                continue
            live.append(item)
        self.pending = live

    def forget(self, requests: set[object]) -> None:
        """Cancel the queued sequences of these requests (one of theirs failed)."""
        for item in self.pending:
            if item.request in requests:
                item.future.cancel()

    def time_to_wait(self, closing: bool) -> float:
        """Seconds the oldest sequence should still wait for company (<= 0: run now)."""
        if closing or self.options.max_delay_s <= 0:
            return 0.0
        oldest = self.pending[0]
        if oldest.length > self.options.max_batched_seq_len:
            return 0.0  # it runs alone: company would not join it
        kin = [i for i in self.pending if i.kind == oldest.kind]
        full_by_count = 0 < self.options.max_batch_size <= len(kin)
        full_by_tokens = max(i.length for i in kin) * len(kin) >= self.options.max_batch_tokens
        if full_by_count or full_by_tokens:
            return 0.0
        return oldest.enqueued + self.options.max_delay_s - self.clock.now()

    def take_batch(self) -> list[EncodeItem]:
        """The oldest sequence plus those of its kind closest to it in length, under budget:
        only short sequences share a batch, and only while padding stays small."""
        options = self.options
        oldest = self.pending[0]
        batch, longest, real = [oldest], oldest.length, oldest.length
        if oldest.length <= options.max_batched_seq_len:
            similar = sorted(
                (
                    i
                    for i in self.pending[1:]
                    if i.kind == oldest.kind and i.length <= options.max_batched_seq_len
                ),
                key=lambda i: abs(i.length - oldest.length),
            )
            for item in similar:
                if len(batch) == options.max_batch_size:
                    break
                new_longest = max(longest, item.length)
                padded, new_real = new_longest * (len(batch) + 1), real + item.length
                if padded > options.max_batch_tokens:
                    continue
                if padded > (1 + options.max_padding) * new_real:
                    continue
                batch.append(item)
                longest, real = new_longest, new_real
        chosen = set(map(id, batch))
        self.pending = [i for i in self.pending if id(i) not in chosen]
        return batch


def padded_ids(batch: list[EncodeItem], pad_id: int) -> np.ndarray:
    """The batch's ids (B, longest), right-padded: exact for a causal model."""
    longest = max(item.length for item in batch)
    ids = np.full((len(batch), longest), pad_id, dtype=np.int64)
    for row, item in enumerate(batch):
        ids[row, : item.length] = item.ids
    return ids


def answer(batch: list[EncodeItem], outputs: Any, inference_s: float, start: float) -> None:
    """Hand each sequence of a batch that ran its slice of the outputs."""
    kind = batch[0].kind
    embeddings, extras = outputs if kind is not None else (outputs, [None] * len(batch))
    for row, item in enumerate(batch):
        if item.future.done():
            continue
        extra = extras[row]
        readouts = extra if isinstance(extra, ReadoutOutput) else None
        item.future.set_result(
            SequenceResult(
                embeddings=embeddings[row, : item.length],
                attention=readouts.attention if readouts else extra,
                queue_ns=int((start - item.enqueued) * 1e9),
                inference_ns=int(inference_s * 1e9),
                readouts=readouts,
            )
        )
