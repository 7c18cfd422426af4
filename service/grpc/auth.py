"""Optional bearer-token check on every RPC except health and reflection (probes carry no token)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc

from attnserve.service.core.auth import check_bearer
from attnserve.service.core.errors import UnauthenticatedError
from attnserve.service.grpc.utils import status_for

OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if details.method.startswith(OPEN_SERVICES):
            return await continuation(details)
        metadata = dict(details.invocation_metadata or ())
        try:
            check_bearer(
                str(metadata.get("authorization", "")),
                self._token,
                "'authorization: Bearer <token>' metadata",
            )
        except UnauthenticatedError as exc:
            return _refusing(await continuation(details), str(exc))
        return await continuation(details)


def _refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that aborts with UNAUTHENTICATED."""
    code = status_for(UnauthenticatedError())

    async def unary(request, context: grpc.aio.ServicerContext):
        await context.abort(code, message)

    async def streaming(request_or_iterator, context: grpc.aio.ServicerContext):
        await context.abort(code, message)
        yield  # pragma: no cover  (makes this an async generator, as streaming handlers are)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming)
    return grpc.unary_unary_rpc_method_handler(unary)
