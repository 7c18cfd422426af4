"""The one place where the service's errors become gRPC status codes."""

from __future__ import annotations

import grpc

from attnserve.service import errors

STATUS_CODES: dict[type[errors.AttnserveError], grpc.StatusCode] = {
    errors.InvalidInputError: grpc.StatusCode.INVALID_ARGUMENT,
    errors.QueueFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.ResponseTooLargeError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.NotReadyError: grpc.StatusCode.UNAVAILABLE,
    errors.DeadlineExceededError: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    errors.InferenceError: grpc.StatusCode.INTERNAL,
}


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The status code of an error; anything unexpected is INTERNAL."""
    for cls in type(exc).__mro__:
        if cls in STATUS_CODES:
            return STATUS_CODES[cls]
    return grpc.StatusCode.INTERNAL
