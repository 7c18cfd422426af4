"""The gRPC transport: EncoderService methods, proto <-> plans, errors -> status codes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import grpc

from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1 import encoder_service_pb2_grpc as pb_grpc
from model.tokenizer import get_tokenizer
from service.batcher import Batcher
from service.encoding import check_response_size, fill_result, plan_request
from service.errors import AttnserveError, NotReadyError
from service.metrics import Metrics
from service.runtime import OrtRuntime
from service.status import status_for

log = logging.getLogger(__name__)


class EncoderServicer(pb_grpc.EncoderServiceServicer):
    def __init__(
        self,
        runtime: OrtRuntime,
        batcher: Batcher,
        metrics: Metrics,
        max_message_bytes: int,
    ) -> None:
        self.runtime = runtime
        self.config = runtime.config
        self.tokenizer = get_tokenizer(runtime.config, runtime.model_path.parent)
        self.batcher = batcher
        self.metrics = metrics
        self.max_message_bytes = max_message_bytes
        # Why new work is refused (UNAVAILABLE), or None while serving.
        self.refusal: str | None = "the model is warming up; retry shortly"
        self._in_flight = 0  # requests between admission and answer
        self._idle = asyncio.Event()
        self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is in flight (draining); False if `timeout` ran out first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def Encode(
        self, request: pb.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> pb.EncodeResponse:
        start = time.perf_counter_ns()
        try:
            response = await self._encode(request, _deadline(context), start)
        except Exception as exc:
            if not isinstance(exc, AttnserveError):  # a bug: say so in the log, answer INTERNAL
                log.exception("Encode failed unexpectedly")
            self._count("Encode", status_for(exc), start)
            await context.abort(status_for(exc), str(exc))
        self._count("Encode", grpc.StatusCode.OK, start)
        return response

    async def EncodeStream(
        self,
        request_iterator: AsyncIterator[pb.EncodeStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.EncodeStreamResponse]:
        # Requests are answered in order; a bad one gets an error message and the stream goes on.
        async for item in request_iterator:
            start = time.perf_counter_ns()
            request_id = item.request.request_id
            try:
                response = await self._encode(item.request, _deadline(context), start)
            except AttnserveError as exc:
                code = status_for(exc)
                self._count("EncodeStream", code, start)
                yield pb.EncodeStreamResponse(
                    request_id=request_id,
                    error=pb.EncodeError(code=code.value[0], message=str(exc)),
                )
                continue
            self._count("EncodeStream", grpc.StatusCode.OK, start)
            yield pb.EncodeStreamResponse(request_id=request_id, response=response)

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        c = self.config
        self.metrics.requests.labels("GetModelInfo", "OK").inc()
        return pb.GetModelInfoResponse(
            name=c.name,
            version=self.runtime.version,
            n_layers=c.n_layers,
            n_heads=c.n_heads,
            d_model=c.d_model,
            max_seq_len=c.max_seq_len,
            vocab_size=c.vocab_size,
            tokenizer=self.tokenizer.kind,
            provider=self.runtime.provider,
            precision=self.runtime.precision,
            config_json=c.to_json(),
            max_message_bytes=self.max_message_bytes,
            max_batch_tokens=self.batcher.options.max_batch_tokens,
            bos_id=c.bos_id,
            pad_id=c.pad_id,
        )

    async def _encode(
        self, request: pb.EncodeRequest, deadline: float | None, start: int
    ) -> pb.EncodeResponse:
        if self.refusal:
            raise NotReadyError(self.refusal)
        self._in_flight += 1
        self.metrics.in_flight.set(self._in_flight)
        self._idle.clear()
        try:
            return await self._admitted(request, deadline, start)
        finally:
            self._in_flight -= 1
            self.metrics.in_flight.set(self._in_flight)
            if not self._in_flight:
                self._idle.set()

    async def _admitted(
        self, request: pb.EncodeRequest, deadline: float | None, start: int
    ) -> pb.EncodeResponse:
        plan = plan_request(request, self.config, self.tokenizer)
        check_response_size(plan, self.config, self.max_message_bytes)
        futures = self.batcher.submit(plan.sequences, plan.attention is not None, deadline)
        try:
            results = await asyncio.gather(*futures)
        except BaseException:
            for future in futures:  # one sequence failed: drop the rest of the request's work
                future.cancel()
            raise
        response = pb.EncodeResponse(
            model_version=self.runtime.version, request_id=request.request_id
        )
        for ids, cut, result in zip(plan.sequences, plan.truncated, results, strict=True):
            out = response.results.add()
            fill_result(out, ids, cut, result, plan)
            if plan.return_tokens:
                out.tokens[:] = self.tokenizer.token_strings(out.token_ids)
        t = response.timings
        t.queue_ns = max(r.queue_ns for r in results)
        t.inference_ns = max(r.inference_ns for r in results)
        t.total_ns = time.perf_counter_ns() - start
        return response

    def _count(self, method: str, code: grpc.StatusCode, start: int) -> None:
        self.metrics.requests.labels(method, code.name).inc()
        self.metrics.request_latency.labels(method).observe((time.perf_counter_ns() - start) / 1e9)


def _deadline(context: grpc.aio.ServicerContext) -> float | None:
    """The client's deadline on time.monotonic()'s clock, or None without one."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining
