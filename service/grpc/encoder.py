"""attnserve.v1.EncoderService over the served models (a request's `model` names one; empty:
the default); errors become status codes through handle_errors (a stream's failed request
becomes an EncodeError in the stream)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from attnserve.service.core.repository import ModelRepository
from attnserve.service.core.status import log_unexpected
from attnserve.service.grpc.utils import handle_errors, handle_stream_errors, status_for
from attnserve.service.v1.encode import encode, encode_layers, model_info
from attnserve.service.v1.generate import generate
from attnserve.service.v1.graph import graph
from attnserve.service.v1.response import EncodeAnswer
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1 import encoder_service_pb2_grpc as pb_grpc

# Requests of one EncodeStream in flight at once: enough for them to share batches,
# bounded so that one stream cannot fill the queue by itself.
STREAM_WINDOW = 32


class EncoderServicer(pb_grpc.EncoderServiceServicer):
    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository

    @handle_errors
    async def Encode(self, request: pb.EncodeRequest, context: grpc.aio.ServicerContext) -> bytes:
        """The serialized EncodeResponse (made inside the request's memory budget)."""
        with self.repository.observed("Encode") as find:
            plane = find(request.model)
            return await encode(plane, request, context.time_remaining(), EncodeAnswer.serialize)

    async def EncodeStream(
        self,
        request_iterator: AsyncIterator[pb.EncodeStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[bytes]:
        """Pipelined: up to STREAM_WINDOW requests run at once (so they batch together),
        answers (serialized EncodeStreamResponses) go back in request order; a failed request
        gets an EncodeError and the stream goes on."""
        window: asyncio.Queue[asyncio.Task | None] = asyncio.Queue(STREAM_WINDOW)

        async def read() -> None:
            try:
                async for item in request_iterator:
                    answer = self._stream_answer(item.request, context)
                    await window.put(asyncio.ensure_future(answer))
            finally:
                await window.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (task := await window.get()) is not None:
                yield await task
            await reader  # raises what broke the request stream, if anything did
        finally:
            reader.cancel()
            while not window.empty():
                if task := window.get_nowait():
                    task.cancel()

    async def _stream_answer(
        self, request: pb.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> bytes:
        """The answer to one request of a stream, or the EncodeError that says why not
        (anything unexpected is INTERNAL, and logged: this is the stream's error wrapper)."""
        envelope = pb.EncodeStreamResponse(request_id=request.request_id)
        try:
            with self.repository.observed("EncodeStream") as find:
                plane = find(request.model)
                return await encode(
                    plane,
                    request,
                    context.time_remaining(),
                    lambda answer: answer.serialize_in(envelope, "response"),
                )
        except Exception as exc:
            log_unexpected("EncodeStream", exc)
            message = str(exc) or type(exc).__name__
            envelope.error.CopyFrom(pb.EncodeError(code=status_for(exc).value[0], message=message))
            return envelope.SerializeToString()

    @handle_stream_errors
    async def EncodeLayers(
        self, request: pb.EncodeLayersRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """The answer, then its attention weights one layer per message (serialized
        EncodeLayersResponses)."""
        with self.repository.observed("EncodeLayers") as find:
            plane = find(request.request.model)
            async for part in encode_layers(plane, request.request, context.time_remaining()):
                yield part

    @handle_stream_errors
    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        """A GenerateResponse per token as it is made; a client that cancels the call takes
        its text out of the running batch."""
        with self.repository.observed("Generate") as find:
            plane = find(request.model)
            async for message in generate(plane, request, context.time_remaining()):
                yield message

    @handle_stream_errors
    async def Graph(
        self, request: pb.GraphRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GraphResponse]:
        """GraphResponses of progress, then the graph; a client that cancels the call
        stops the graph at its next backward pass."""
        with self.repository.observed("Graph") as find:
            plane = find(request.model)
            async for message in graph(plane, request, context.time_remaining()):
                yield message

    @handle_errors
    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        with self.repository.observed("GetModelInfo") as find:
            return model_info(find(request.model))


def add_encoder_service(servicer: EncoderServicer, server: grpc.aio.Server) -> None:
    """The generated add_EncoderServiceServicer_to_server, but the answers of Encode,
    EncodeStream and EncodeLayers arrive serialized (their large tensors spliced in)."""
    rpc_method_handlers = {
        "Encode": grpc.unary_unary_rpc_method_handler(
            servicer.Encode,
            request_deserializer=pb.EncodeRequest.FromString,
            response_serializer=None,  # the servicer returns the bytes
        ),
        "EncodeStream": grpc.stream_stream_rpc_method_handler(
            servicer.EncodeStream,
            request_deserializer=pb.EncodeStreamRequest.FromString,
            response_serializer=None,  # the servicer yields the bytes
        ),
        "EncodeLayers": grpc.unary_stream_rpc_method_handler(
            servicer.EncodeLayers,
            request_deserializer=pb.EncodeLayersRequest.FromString,
            response_serializer=None,  # the servicer yields the bytes
        ),
        "GetModelInfo": grpc.unary_unary_rpc_method_handler(
            servicer.GetModelInfo,
            request_deserializer=pb.GetModelInfoRequest.FromString,
            response_serializer=pb.GetModelInfoResponse.SerializeToString,
        ),
        "Generate": grpc.unary_stream_rpc_method_handler(
            servicer.Generate,
            request_deserializer=pb.GenerateRequest.FromString,
            response_serializer=pb.GenerateResponse.SerializeToString,
        ),
        "Graph": grpc.unary_stream_rpc_method_handler(
            servicer.Graph,
            request_deserializer=pb.GraphRequest.FromString,
            response_serializer=pb.GraphResponse.SerializeToString,
        ),
    }
    service = pb.DESCRIPTOR.services_by_name["EncoderService"].full_name
    generic = grpc.method_handlers_generic_handler(service, rpc_method_handlers)
    server.add_generic_rpc_handlers((generic,))
    server.add_registered_method_handlers(service, rpc_method_handlers)
