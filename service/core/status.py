"""The one place where the service's errors become gRPC status codes and HTTP statuses, and
where an unexpected one is logged (by the transports' error wrappers, whatever the call)."""

from __future__ import annotations

import logging
from http import HTTPStatus

import grpc

from attnserve.service.core import errors

# error class -> (gRPC status code, HTTP status); anything else is INTERNAL / 500.
STATUS_CODES: dict[type[errors.AttnserveError], tuple[grpc.StatusCode, HTTPStatus]] = {
    errors.InvalidInputError: (grpc.StatusCode.INVALID_ARGUMENT, HTTPStatus.BAD_REQUEST),
    errors.ModelNotFoundError: (grpc.StatusCode.NOT_FOUND, HTTPStatus.NOT_FOUND),
    errors.QueueFullError: (grpc.StatusCode.RESOURCE_EXHAUSTED, HTTPStatus.TOO_MANY_REQUESTS),
    errors.RequestTooLargeError: (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    ),
    errors.ResponseTooLargeError: (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    ),
    errors.NotReadyError: (grpc.StatusCode.UNAVAILABLE, HTTPStatus.SERVICE_UNAVAILABLE),
    errors.DeadlineExceededError: (
        grpc.StatusCode.DEADLINE_EXCEEDED,
        HTTPStatus.GATEWAY_TIMEOUT,
    ),
    errors.UnauthenticatedError: (grpc.StatusCode.UNAUTHENTICATED, HTTPStatus.UNAUTHORIZED),
    errors.InferenceError: (grpc.StatusCode.INTERNAL, HTTPStatus.INTERNAL_SERVER_ERROR),
    errors.UnsupportedError: (grpc.StatusCode.UNIMPLEMENTED, HTTPStatus.NOT_IMPLEMENTED),
    # A model that cannot be loaded (a broken directory): the repository's load answers so.
    errors.ModelLoadError: (grpc.StatusCode.FAILED_PRECONDITION, HTTPStatus.BAD_REQUEST),
}
_UNEXPECTED = (grpc.StatusCode.INTERNAL, HTTPStatus.INTERNAL_SERVER_ERROR)
log = logging.getLogger(__name__)


def _codes(exc: BaseException) -> tuple[grpc.StatusCode, HTTPStatus]:
    for cls in type(exc).__mro__:
        if cls in STATUS_CODES:
            return STATUS_CODES[cls]
    return _UNEXPECTED


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The gRPC status code of an error; anything unexpected is INTERNAL."""
    return _codes(exc)[0]


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
    return "OK" if exc is None else status_for(exc).name
