"""Stand-ins for where ORT and the wall clock are not the subject: the batcher's policy."""

from __future__ import annotations

import asyncio
import threading
from types import MappingProxyType

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.service.core.backend import (
    AttentionOutput,
    AttentionSelection,
    ReadoutOutput,
    ReadoutSelection,
)
from attnserve.service.core.errors import InferenceError

FAKE_CONFIG = ModelConfig(n_layers=2, n_heads=2, d_model=4, d_ff=8, max_seq_len=64)


class FakeBackend:
    """A causal stand-in for the model (implements service.backend.Backend).

    Position t's outputs depend only on the ids up to t, as in the real model, so
    right padding must not change them. Every call is recorded; `gate` (set by
    default) holds a call inside the "model" while cleared; a batch holding
    `fail_on` raises InferenceError as a failed ORT run would.
    """

    version = "fake-1"
    provider = "cpu"
    precision = "fp32"
    graphs = frozenset({"readouts"})
    saes = MappingProxyType({})  # serves no SAE
    gradient_lengths = ()  # no attribution patching

    def __init__(self, config: ModelConfig = FAKE_CONFIG, fail_on: int | None = None) -> None:
        self.config = config
        self.fail_on = fail_on
        self.calls: list[tuple[str, np.ndarray]] = []  # (method, input_ids), in call order
        self.threads: list[str] = []  # the thread each call ran on, in call order
        self.gate = threading.Event()
        self.gate.set()
        self.released = threading.Event()  # set once release_memory was called
        self._called = threading.Condition()

    def embed(self, input_ids: np.ndarray) -> np.ndarray:
        self._enter("embed", input_ids)
        return self._embeddings(input_ids)

    def attend(
        self, input_ids: np.ndarray, lengths: list[int], selections: list[AttentionSelection]
    ) -> tuple[np.ndarray, list[AttentionOutput]]:
        """Each row's full weights (selections are ORT's business, not the batcher's)."""
        self._enter("attend", input_ids)
        weights = self._attentions(input_ids)
        outputs = [
            AttentionOutput(np.arange(n), weights[row, :, :, :n, :n], None, None)
            for row, n in enumerate(lengths)
        ]
        return self._embeddings(input_ids), outputs

    def read(
        self, input_ids: np.ndarray, lengths: list[int], selections: list[ReadoutSelection]
    ) -> tuple[np.ndarray, list[ReadoutOutput]]:
        """The embeddings, each row scaled by the mean of its hook_z scale (a head mask
        changes them)."""
        self._enter("read", input_ids)
        scale = [float(s.changes["z"].scale.mean()) if s.changes else 1.0 for s in selections]
        embeddings = self._embeddings(input_ids) * np.array(scale, np.float32)[:, None, None]
        return embeddings, [ReadoutOutput() for _ in lengths]

    def warmup(self) -> None:
        pass

    def refresh_saes(self) -> bool:
        return False

    def release_memory(self) -> None:
        self.released.set()

    def wait_calls(self, n: int, timeout: float = 30) -> None:
        """Block until at least n calls have entered the backend."""
        with self._called:
            if not self._called.wait_for(lambda: len(self.calls) >= n, timeout):
                raise TimeoutError(f"{len(self.calls)} backend calls, expected {n}")

    def shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(method, ids.shape) for method, ids in self.calls]

    def _enter(self, method: str, input_ids: np.ndarray) -> None:
        with self._called:
            self.calls.append((method, input_ids.copy()))
            self.threads.append(threading.current_thread().name)
            self._called.notify_all()
        self.gate.wait()
        if self.fail_on is not None and (input_ids == self.fail_on).any():
            raise InferenceError(f"fake ORT failure on id {self.fail_on}")

    def _embeddings(self, ids: np.ndarray) -> np.ndarray:
        running = np.cumsum(ids, axis=1, dtype=np.float32)  # (B, T): ids[:t + 1] only
        scale = np.arange(1, self.config.d_model + 1, dtype=np.float32)
        return running[:, :, None] * scale  # (B, T, D)

    def _attentions(self, ids: np.ndarray) -> np.ndarray:
        b, t = ids.shape
        causal = np.tril(np.ones((t, t), dtype=np.float32))  # row i sees keys 0..i
        rows = causal * ids[:, None, :].astype(np.float32)  # (B, T, T)
        c = self.config
        return np.broadcast_to(rows[:, None, None], (b, c.n_layers, c.n_heads, t, t)).copy()


class FakeClock:
    """Time that moves only when a test says so (implements core.batching.Clock).

    `waiting` is set whenever the batcher waits on the clock, so a test knows the
    batcher is holding a batch back, rather than hoping it got that far.
    """

    def __init__(self) -> None:
        self.time = 0.0
        self.waiting = asyncio.Event()
        self._tick = asyncio.Event()

    def now(self) -> float:
        return self.time

    def advance(self, seconds: float) -> None:
        self.time += seconds
        self._tick.set()

    async def wait(self, event: asyncio.Event, timeout: float) -> None:
        until = self.time + timeout
        while self.time < until and not event.is_set():
            self._tick.clear()
            self.waiting.set()
            waits = [asyncio.ensure_future(e.wait()) for e in (event, self._tick)]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self.waiting.clear()
                for w in waits:
                    w.cancel()
