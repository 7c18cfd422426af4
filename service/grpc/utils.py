"""The gRPC transport's one error wrapper: a servicer method's error becomes its status code.

The code comes from the one table (service/core/status.py); the message is the error's own,
which names the field and the limit. Anything unexpected is INTERNAL, logged here with its
traceback whatever the call.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from attnserve.service.core.status import log_unexpected, status_for

Response = TypeVar("Response")
Method = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[Response]]


def handle_errors(method: Method[Response]) -> Method[Response]:
    """Wrap a unary servicer method: what it raises aborts the call with its status."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Response:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            log_unexpected(method.__name__, exc)
            await context.abort(status_for(exc), str(exc) or type(exc).__name__)
            raise  # abort raises; this line is for the type checker

    return wrapper
