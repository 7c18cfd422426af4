"""The HTTP transport's one error wrapper: every refusal in the shape of the API it was sent
to, with the status of service/core/status.py's one table; and the request-size limit.

The shape comes from the path: OpenAI's `{"error": {"message", "type", "param", "code"}}`
(its SDK reads that) everywhere but the Open Inference Protocol's `/v2` and Neuronpedia's
`/v1/activation`, which answer `{"error": "..."}`. Routes raise the service's typed errors;
`ErrorRoute` answers them (and logs anything unexpected with its traceback), and the app's
handlers (`add_error_handlers`) answer the framework's own refusals alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from attnserve.service.core.errors import (
    AttnserveError,
    InvalidInputError,
    ModelNotFoundError,
    RequestTooLargeError,
    field_of,
)
from attnserve.service.core.status import http_status_for, log_unexpected

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


# The APIs whose refusals are {"error": "..."}: the Open Inference Protocol's and
# Neuronpedia's; every other path answers in OpenAI's shape.
PLAIN_ERROR_PATHS = ("/v2", "/v1/activation", "/generate-graph", "/check-busy")


class FrameworkError(Exception):
    """A refusal of the framework's (404 no such route, 405 wrong method), with its status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = HTTPStatus(status)


def error_response(path: str, exc: BaseException) -> JSONResponse:
    """`exc` as the API under `path` answers a refusal, with its status."""
    status = exc.status if isinstance(exc, FrameworkError) else http_status_for(exc)
    message = str(exc) or type(exc).__name__
    if path.startswith(PLAIN_ERROR_PATHS):
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
            "param": field_of(exc),
            "code": code,
        }
    }
    return JSONResponse(body, status_code=status)


class ErrorRoute(APIRoute):
    """A route whose errors, its dependencies' included, are answered by `error_response`
    (the framework's validation and HTTP errors go on to the app's handlers)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except (RequestValidationError, HTTPException):
                raise
            except Exception as exc:
                log_unexpected(f"{request.method} {request.url.path}", exc)
                return error_response(request.url.path, exc)

        return answer


def add_error_handlers(app: FastAPI) -> None:
    """The framework's own refusals (a body that does not validate, no such route, wrong
    method, a body it cannot read) in the API's error shape, with their status."""

    @app.exception_handler(AttnserveError)
    async def refused(request: Request, exc: AttnserveError) -> JSONResponse:
        return error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        kind = request.headers.get("content-type", "")
        if kind and "json" not in kind:  # FastAPI reads no body of another type
            message = f"the body must be JSON, with Content-Type: application/json (not {kind!r})"
            return error_response(request.url.path, InvalidInputError(message))
        problems: dict[str, list[str]] = {}  # a union's members fail at one path each
        for error in exc.errors():
            said = problems.setdefault(_path(error["loc"]), [])
            if _problem(error) not in said:
                said.append(_problem(error))
        message = "; ".join(f"{path}: {' | '.join(said)}" for path, said in problems.items())
        return error_response(request.url.path, InvalidInputError(message))

    @app.exception_handler(HTTPException)
    async def framework_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 413:
            return error_response(request.url.path, RequestTooLargeError(str(exc.detail)))
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if isinstance(exc.__cause__, UnicodeDecodeError):  # what FastAPI's 400 is about
            bad = exc.__cause__
            message = f"the body is not UTF-8 JSON: {bad.reason} at byte {bad.start}"
        if exc.status_code == 400:
            return error_response(request.url.path, InvalidInputError(message))
        return error_response(request.url.path, FrameworkError(exc.status_code, message))


def _path(loc: tuple) -> str:
    """A validation error's location as the body names it (interventions[0].values), the
    members of a union it names left out (prompt, not prompt.list[int])."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not _UNION_MEMBER.fullmatch(part):
            path += f".{part}" if path else part
    return path or "body"


# How pydantic names a union's member in a location: str, list[int], function-after[...].
_UNION_MEMBER = re.compile(r"(str|int|float|bool|none|list|dict|[\w-]+\[.*\])")


def _problem(error: dict) -> str:
    if error["type"] == "extra_forbidden":
        return "not a field here"
    given = error.get("input")
    if error["type"].endswith("_type") and isinstance(given, str | int | float | bool):
        return f"{error['msg']} (got {given!r})"
    return error["msg"]


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
        async def nothing() -> dict:  # the response reads nothing of the request
            return {}

        error = RequestTooLargeError(
            f"the request body is larger than the {self.limit:,}-byte message limit"
        )
        await error_response(scope["path"], error)({"type": "http"}, nothing, send)
