"""The one place where the service's errors get their status: the canonical code's name
(gRPC's, which the metrics count and service/grpc/utils.py answers with) and the HTTP
status; and where an unexpected one is logged (by the transports' error wrappers, whatever
the call)."""

from __future__ import annotations

import logging
from http import HTTPStatus

from attnserve.service.core import errors

# error class -> (canonical status code, HTTP status); anything else is INTERNAL / 500.
STATUS_CODES: dict[type[errors.AttnserveError], tuple[str, HTTPStatus]] = {
    errors.InvalidInputError: ("INVALID_ARGUMENT", HTTPStatus.BAD_REQUEST),
    errors.ModelNotFoundError: ("NOT_FOUND", HTTPStatus.NOT_FOUND),
    errors.QueueFullError: ("RESOURCE_EXHAUSTED", HTTPStatus.TOO_MANY_REQUESTS),
    errors.RequestTooLargeError: (
        "RESOURCE_EXHAUSTED",
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    ),
    errors.ResponseTooLargeError: (
        "RESOURCE_EXHAUSTED",
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    ),
    errors.NotReadyError: ("UNAVAILABLE", HTTPStatus.SERVICE_UNAVAILABLE),
    errors.DeadlineExceededError: (
        "DEADLINE_EXCEEDED",
        HTTPStatus.GATEWAY_TIMEOUT,
    ),
    errors.UnauthenticatedError: ("UNAUTHENTICATED", HTTPStatus.UNAUTHORIZED),
    errors.InferenceError: ("INTERNAL", HTTPStatus.INTERNAL_SERVER_ERROR),
    errors.UnsupportedError: ("UNIMPLEMENTED", HTTPStatus.NOT_IMPLEMENTED),
    # A model that cannot be loaded (a broken directory): the repository's load answers so.
    errors.ModelLoadError: ("FAILED_PRECONDITION", HTTPStatus.BAD_REQUEST),
}
_UNEXPECTED = ("INTERNAL", HTTPStatus.INTERNAL_SERVER_ERROR)
log = logging.getLogger(__name__)


def _codes(exc: BaseException) -> tuple[str, HTTPStatus]:
    for cls in type(exc).__mro__:
        if cls in STATUS_CODES:
            return STATUS_CODES[cls]
    return _UNEXPECTED


def http_status_for(exc: BaseException) -> HTTPStatus:
    """The HTTP status of an error; anything unexpected is 500."""
    return _codes(exc)[1]


def log_unexpected(call: str, exc: BaseException) -> None:
    """Log `exc` with its traceback unless the service raised it on purpose: what each
    transport's error wrapper does with every error it answers."""
    if not isinstance(exc, errors.AttnserveError):
        log.error("%s failed unexpectedly", call, exc_info=exc)


def code_name(exc: BaseException | None) -> str:
    """The outcome as the metrics count it, whatever the transport: "OK", or the canonical
    code of the error ("INVALID_ARGUMENT", "INTERNAL", ...)."""
    return "OK" if exc is None else _codes(exc)[0]
