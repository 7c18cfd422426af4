"""A memory budget for admitted work: bytes reserved before a request runs, waited for if
they are not there.

Attention makes memory, not model time, the scarce resource: one 1024-token
request with every layer's and head's weights makes 134 MB of float32 inside
ORT before any of it is reduced. Requests reserve what they will hold
(`request_bytes`) and wait, first come first served, while the budget is spent;
one request larger than the whole budget runs alone. Deadlines still apply to
the wait.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import replace

from attnserve.model.config import ModelConfig
from attnserve.service.core.errors import DeadlineExceededError
from attnserve.service.core.plan import EncodePlan, attention_weight_bytes, response_bytes
from attnserve.service.core.readouts import readout_work_bytes

# A block of query rows' scores and the tensors made of them (service/ort/blocks.py): the
# rows per block are planned to fit it.
ATTENTION_BLOCK_BYTES = 256 * 2**20


def request_bytes(plan: EncodePlan, config: ModelConfig) -> int:
    """What a request holds at its peak: its answer twice (numpy, then its serialized
    bytes); per sequence with attention or readouts (whose graph computes attention too),
    its float32 T x T weights twice (each layer's, then stacked), or where its attention
    is computed by query blocks its queries and keys and one block; the square map of
    what it asked before it is packed where it asked for the causal-packed layout; and
    what its readouts work in."""
    total = 2 * response_bytes(plan, config)
    blocked = [s.blocked for s in plan.attention or ()] or [False] * len(plan.sequences)
    if plan.attention or plan.readouts:
        per_weight = config.n_layers * config.n_heads * 4
        for ids, by_blocks in zip(plan.sequences, blocked, strict=True):
            if by_blocks:
                total += queries_bytes(config, len(ids)) + ATTENTION_BLOCK_BYTES
            else:
                total += 2 * per_weight * len(ids) ** 2
    for attention, ids in zip(plan.attention or (), plan.sequences, strict=False):
        if attention.packed:
            total += attention_weight_bytes(replace(attention, packed=False), len(ids))
    for selection, ids in zip(plan.readouts or (), plan.sequences, strict=False):
        total += readout_work_bytes(selection, config, len(ids))
    return total


def queries_bytes(config: ModelConfig, length: int) -> int:
    """The queries graph's queries and keys of a `length`-token text, float32."""
    return config.n_layers * length * (config.n_heads + config.kv_heads) * config.head_dim * 4


class ByteBudget:
    """Reservations of bytes under `limit` (0: no limit), granted in arrival order."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def _fits(self, n: int) -> bool:
        # An empty budget takes anything: a request larger than it runs alone.
        return not self.limit or self.used == 0 or self.used + n <= self.limit

    async def acquire(self, n: int, timeout: float | None = None) -> None:
        """Reserve n bytes; DeadlineExceededError if `timeout` seconds pass first."""
        if not self._waiting and self._fits(n):
            self.used += n
            return
        grant = asyncio.get_running_loop().create_future()
        entry = (n, grant)
        self._waiting.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(grant), timeout)
        except BaseException as exc:
            if grant.done() and not grant.cancelled():  # granted as we gave up: hand it back
                self.release(n)
            else:
                grant.cancel()
                self._waiting.remove(entry)
                self._grant()  # those behind may fit now
            if isinstance(exc, TimeoutError):
                raise DeadlineExceededError(
                    f"the deadline passed while the request waited for {n:,} bytes of the "
                    f"{self.limit:,}-byte memory budget (--max-inflight-bytes)"
                ) from None
            raise

    def release(self, n: int) -> None:
        self.used -= n
        self._grant()

    def _grant(self) -> None:
        while self._waiting and self._fits(self._waiting[0][0]):
            n, grant = self._waiting.popleft()
            self.used += n
            grant.set_result(None)

    @property
    def waiting(self) -> int:
        return len(self._waiting)
