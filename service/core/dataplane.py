"""What every transport calls for one model version: admission, one pass from request to
response, model info.

A transport finds the data plane of the model a request names inside
`ModelRepository.observed` (core/repository.py: the request metrics and the log of
unexpected errors, so every transport counts alike), turns its wire format into an
`EncodeRequest`, awaits `DataPlane.encode` (or `results`), and maps the typed errors it
raises (core/status.py). The data plane owns readiness and draining (so every transport
refuses alike), plans the request once, reserves its room in the process's memory budget,
hands the sequences to the batcher and builds the answer; it never sees gRPC or HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence

from attnserve.model.tokenizer import Tokenizer
from attnserve.service.core.backend import Backend, WeightsInfo
from attnserve.service.core.batcher import Batcher, SequenceResult
from attnserve.service.core.budget import ByteBudget, request_bytes
from attnserve.service.core.errors import DeadlineExceededError, NotReadyError
from attnserve.service.core.memory import give_back_memory
from attnserve.service.core.metrics import ModelMetrics
from attnserve.service.core.plan import (
    EncodePlan,
    Input,
    check_response_size,
    inputs_of,
    plan_request,
)
from attnserve.service.core.response import EncodeAnswer, build_response, split_attention_layers
from attnserve.v1 import encoder_service_pb2 as pb

log = logging.getLogger(__name__)

# Give memory back once the server has been idle (release_after_idle_s) after at least this
# much work came and went (not after every request: the next one would pay to fault it in
# again, about a second per GiB on a virtual machine).
TRIM_AFTER_BYTES = 256 * 1024 * 1024
WARMING_UP = "the model is warming up; retry shortly"
SHUTTING_DOWN = "the server is shutting down; retry on another replica"


class DataPlane:
    """One served model version: its backend, batcher and tokenizer, admission and drain."""

    def __init__(
        self,
        name: str,
        version: str,
        backend: Backend,
        batcher: Batcher,
        tokenizer: Tokenizer,
        metrics: ModelMetrics,
        budget: ByteBudget,
        max_message_bytes: int,
        release_memory: bool = True,
        release_after_idle_s: float = 10.0,
        weights: WeightsInfo | None = None,
    ) -> None:
        self.name = name  # as the APIs name it: the repository's folder, or the config's name
        self.version = version  # the repository's version folder; "1" for --model
        self.backend = backend
        self.batcher = batcher
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.budget = budget  # the process's: every model's requests count in it
        self.max_message_bytes = max_message_bytes
        self.release_memory = release_memory
        self.release_after_idle_s = release_after_idle_s
        self.weights = weights or WeightsInfo()  # what GetModelInfo reports of them
        self._released_since_trim = 0
        self._release_timer: asyncio.TimerHandle | None = None
        self._releasing: asyncio.Task | None = None
        # Why new work is refused (UNAVAILABLE), or None while serving.
        self.refusal: str | None = WARMING_UP
        self._in_flight = 0  # requests between admission and answer
        self._idle = asyncio.Event()
        self._idle.set()
        # Gauges read the state when scraped: nothing to update per request.
        metrics.in_flight.set_function(lambda: self._in_flight)

    def matches(self, version: str) -> bool:
        """Whether a request's version names this one ("": any; the weights' hash too)."""
        return version in ("", self.version, self.backend.version)

    async def start(self) -> None:
        """Start the batcher, warm every backend up, then let requests in."""
        self.batcher.start()
        await self.batcher.warm_up()
        if self.release_memory:  # what loading and warming up freed (0.3 GiB for TinyLlama),
            await asyncio.to_thread(give_back_memory)  # off the loop: other models may serve
        self.refusal = None

    def start_draining(self) -> None:
        self.refusal = SHUTTING_DOWN

    async def stop(self) -> None:
        """Finish what was admitted, then stop the batcher and its workers."""
        self._cancel_release()
        await self.batcher.stop()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is in flight (draining); False if `timeout` ran out first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def encode(self, request: pb.EncodeRequest, timeout: float | None = None) -> EncodeAnswer:
        """The whole request: refuse or admit, plan, batch, build. `timeout`: the seconds the
        caller will still wait (its deadline); queued work past it is dropped unrun."""
        start = time.perf_counter_ns()
        async with self.results(inputs_of(request), request.options, timeout) as (plan, results):
            return self._answer(plan, results, request.request_id, start)

    async def encode_layers(
        self, request: pb.EncodeRequest, timeout: float | None = None
    ) -> AsyncIterator[bytes]:
        """EncodeLayers' answer as serialized EncodeLayersResponses: the response without the
        attention weights, then the weights one layer of one input at a time. The request
        holds its room in the memory budget until the last part has been taken."""
        start = time.perf_counter_ns()
        inputs, options = inputs_of(request), request.options
        async with self.results(inputs, options, timeout, by_layer=True) as (plan, results):
            rest, layers = split_attention_layers(plan, results)
            answer = self._answer(plan, rest, request.request_id, start)
            yield answer.serialize_in(pb.EncodeLayersResponse(), "response")
            for layer in layers:
                yield layer.serialize()

    def _answer(
        self, plan: EncodePlan, results: list[SequenceResult], request_id: str, start_ns: int
    ) -> EncodeAnswer:
        """The EncodeResponse of a request received at `start_ns` (perf_counter_ns)."""
        answer = build_response(plan, results, self.tokenizer, self.backend.version, request_id)
        answer.message.timings.total_ns = time.perf_counter_ns() - start_ns
        return answer

    @contextlib.asynccontextmanager
    async def results(
        self,
        inputs: Sequence[Input],
        options: pb.EncodeOptions,
        timeout: float | None = None,
        by_layer: bool = False,
    ) -> AsyncIterator[tuple[EncodePlan, list[SequenceResult]]]:
        """Refuse or admit, plan and run a request (texts or numpy ids, and its options);
        yields the plan and each sequence's arrays, which stay counted in the memory budget
        until the caller has built its answer from them (Encode's protobuf, the Open
        Inference Protocol's outputs, OpenAI's vectors). `by_layer`: the answer goes out as
        EncodeLayers' messages (only the largest must fit in one)."""
        if self.refusal:
            raise NotReadyError(self.refusal)
        self._in_flight += 1
        self._idle.clear()
        try:
            config = self.backend.config
            plan = plan_request(inputs, options, config, self.tokenizer, self.backend.readouts)
            check_response_size(plan, config, self.max_message_bytes, by_layer)
            reserved = request_bytes(plan, config)
            self._cancel_release()  # not idle after all
            deadline = None if timeout is None else time.monotonic() + timeout
            await self.budget.acquire(reserved, timeout)
            try:
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                try:  # gRPC cancels a call at its deadline; this does it for every transport
                    async with asyncio.timeout(left):
                        results = await self.batcher.encode(plan.sequences, plan.selections, left)
                except TimeoutError:
                    raise DeadlineExceededError(
                        f"the deadline ({timeout:g} s) passed before the answer was ready"
                    ) from None
                yield plan, results
            finally:
                self._give_back(reserved)
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    def _give_back(self, reserved: int) -> None:
        """Return a request's room to the budget; after a burst, give memory back once idle."""
        self.budget.release(reserved)
        self._released_since_trim += reserved
        idle = self.budget.used == 0 and not self.budget.waiting
        if self.release_memory and idle and self._released_since_trim >= TRIM_AFTER_BYTES:
            self._cancel_release()
            loop = asyncio.get_running_loop()
            self._release_timer = loop.call_later(self.release_after_idle_s, self._release)

    def _cancel_release(self) -> None:
        if self._release_timer:
            self._release_timer.cancel()
            self._release_timer = None

    def _release(self) -> None:
        """A burst has ended: hand its freed buffers back to the OS."""
        self._release_timer = None
        self._released_since_trim = 0
        if self._releasing is None or self._releasing.done():
            self._releasing = asyncio.ensure_future(self.batcher.release_memory())

    def model_info(self) -> pb.GetModelInfoResponse:
        c = self.backend.config
        return pb.GetModelInfoResponse(
            name=self.name,
            version=self.backend.version,
            n_layers=c.n_layers,
            n_heads=c.n_heads,
            n_kv_heads=c.kv_heads,
            kv_heads=c.kv_head_of,
            d_model=c.d_model,
            max_seq_len=c.max_seq_len,
            vocab_size=c.vocab_size,
            tokenizer=self.tokenizer.kind,
            provider=self.backend.provider,
            precision=self.backend.precision,
            config_json=c.to_json(),
            max_message_bytes=self.max_message_bytes,
            max_batch_tokens=self.batcher.options.max_batch_tokens,
            bos_id=c.bos_id,
            pad_id=c.pad_id,
            weight_bytes=self.weights.disk_bytes,
            resident_weight_bytes=self.weights.resident_bytes,
            attention_max_abs_diff=self.weights.attention_max_abs_diff,
            embedding_cosine_min=self.weights.embedding_cosine_min,
        )
