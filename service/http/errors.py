"""Every HTTP refusal in the shape of the API it was sent to, and the request-size limit.

The status comes from service/core/status.py's one table; the shape from the path: OpenAI's
`{"error": {"message", "type", "param", "code"}}` (its SDK reads that) everywhere but the
Open Inference Protocol's `/v2`, which answers `{"error": "..."}`.
"""

from __future__ import annotations

from http import HTTPStatus

from fastapi.responses import JSONResponse

from attnserve.service.core.errors import ModelNotFoundError, RequestTooLargeError
from attnserve.service.core.status import http_status_for

# OpenAI's error "type" for each HTTP status the API answers with.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout",
}


class FrameworkError(Exception):
    """A refusal of the framework's (404 no such route, 405 wrong method), with its status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = HTTPStatus(status)


def error_response(path: str, exc: BaseException) -> JSONResponse:
    """`exc` as the API under `path` answers a refusal, with its status."""
    status = exc.status if isinstance(exc, FrameworkError) else http_status_for(exc)
    message = str(exc) or type(exc).__name__
    if path.startswith("/v2"):
        return JSONResponse({"error": message}, status_code=status)
    code = (
        "model_not_found"
        if isinstance(exc, ModelNotFoundError)
        else status.phrase.lower().replace(" ", "_")
    )
    body = {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status.value, "server_error"),
            "param": None,
            "code": code,
        }
    }
    return JSONResponse(body, status_code=status)


class BodyLimit:
    """ASGI middleware: request bodies over `limit` bytes get 413 (the gRPC message limit),
    whether they declare their length or come in chunks. The body is read here, counted,
    and handed on whole: the routes read all of it anyway."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and int(declared) > self.limit:
            return await self._too_large(scope, send)
        messages, seen = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # the client went away: the app sees it as it would have
            seen += len(message.get("body", b""))
            if seen > self.limit:
                return await self._too_large(scope, send)
            if not message.get("more_body"):
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, scope, send) -> None:
        error = RequestTooLargeError(
            f"the request body is larger than the {self.limit:,}-byte message limit"
        )
        await error_response(scope["path"], error)({"type": "http"}, None, send)
