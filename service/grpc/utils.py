"""The gRPC transport's error wrappers (a unary method's, a server-streaming method's): what a
servicer method raises becomes its status code.

The code comes from the one table (service/core/status.py); the message is the error's own,
which names the field and the limit. Where it names a field, the status carries it too, as
Google's rich error model does (a google.rpc.Status with a BadRequest field violation in
the `grpc-status-details-bin` trailer): any gRPC client can read which field it was.
Anything unexpected is INTERNAL, logged here with its traceback whatever the call.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from attnserve.service.core.errors import field_of
from attnserve.service.core.status import code_name, log_unexpected

# The trailer of gRPC's rich error model: a serialized google.rpc.Status.
STATUS_DETAILS_KEY = "grpc-status-details-bin"

Response = TypeVar("Response")
Method = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Response]]
StreamMethod = Callable[[Any, Any, grpc.aio.ServicerContext], AsyncIterator[Response]]


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status code of an error (the one table's); anything unexpected is INTERNAL."""
    return grpc.StatusCode[code_name(exc)]


def handle_errors(method: Method[Response]) -> Method[Response]:
    """Wrap a unary servicer method: what it raises aborts the call with its status."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Response:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(method.__name__, exc, context)
            raise  # abort raises; this line is for the type checker

    return wrapper


def handle_stream_errors(method: StreamMethod[Response]) -> StreamMethod[Response]:
    """Wrap a server-streaming servicer method: what it raises, before its first answer or
    after some, aborts the call with its status."""

    @functools.wraps(method)
    async def wrapper(
        self: Any, request: Any, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Response]:
        try:
            async for answer in method(self, request, context):
                yield answer
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(method.__name__, exc, context)

    return wrapper


async def _abort(name: str, exc: Exception, context: grpc.aio.ServicerContext) -> None:
    log_unexpected(name, exc)
    code, message = status_for(exc), str(exc) or type(exc).__name__
    await context.abort(code, message, trailing_metadata=rich_status(code, message, exc))


def rich_status(
    code: grpc.StatusCode, message: str, exc: BaseException
) -> tuple[tuple[str, bytes], ...]:
    """The trailer naming the field `exc` is about (none where it names none)."""
    field = field_of(exc)
    if field is None:
        return ()
    violation = error_details_pb2.BadRequest.FieldViolation(field=field, description=message)
    detail = any_pb2.Any()
    detail.Pack(error_details_pb2.BadRequest(field_violations=[violation]))
    status = status_pb2.Status(code=code.value[0], message=message, details=[detail])
    return ((STATUS_DETAILS_KEY, status.SerializeToString()),)
