"""What the HTTP routes read from the app: the models, the settings, the Open Inference
Protocol's calls (OipProtocol).

The routes are module-level (one router per API); create_app puts these on `app.state`
and the routes take them from the request, so no route is a closure over the server.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from attnserve.service.core.auth import check_bearer
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.repository import ModelRepository
from attnserve.service.oip.model import OipProtocol
from attnserve.service.settings import Settings


@dataclass(frozen=True)
class AppState:
    repository: ModelRepository
    settings: Settings
    oip_protocol: OipProtocol
    started: int  # the Unix time the app was made (OpenAI's model "created")


def state(request: Request) -> AppState:
    return request.app.state.attnserve


def deadline(request: Request) -> float:
    """Seconds this call may take: the client's Request-Timeout header (in seconds, as gRPC
    clients send their deadline), up to --max-http-timeout-s; without one, the server's
    --http-timeout-s."""
    settings = state(request).settings
    given = request.headers.get("request-timeout")
    if given is None:
        return settings.http_timeout_s
    try:
        seconds = float(given)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise InvalidInputError(f"Request-Timeout: {given!r} is not a positive number of seconds")
    if seconds > settings.max_http_timeout_s:
        raise InvalidInputError(
            f"Request-Timeout: {given} seconds is more than this server allows "
            f"({settings.max_http_timeout_s:g}: --max-http-timeout-s)"
        )
    return seconds


def authorized(request: Request) -> None:
    """The routes' dependency: with --auth-token set, the Authorization header must match."""
    token = state(request).settings.auth_token
    if token:
        check_bearer(
            request.headers.get("authorization", ""),
            token,
            "'Authorization: Bearer <token>' header",
        )
