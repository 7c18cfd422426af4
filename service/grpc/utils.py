"""The gRPC transport's error wrappers (a unary method's, a server-streaming method's): what a
servicer method raises becomes its status code.

The code comes from the one table (service/core/status.py); the message is the error's own,
which names the field and the limit. Anything unexpected is INTERNAL, logged here with its
traceback whatever the call.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from attnserve.service.core.status import code_name, log_unexpected

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
    await context.abort(status_for(exc), str(exc) or type(exc).__name__)
