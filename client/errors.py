"""The client's one error type: a call the server refused or failed, with its status code,
the server's message and the request field it names (from the rich status the server
sends: a google.rpc.BadRequest field violation in the `grpc-status-details-bin` trailer).

It is a grpc.RpcError, so `except grpc.RpcError` and `.code()` / `.details()` keep working;
it is not grpc's own `_InactiveRpcError`, whose repr holds a debug string."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import grpc
from google.rpc import error_details_pb2, status_pb2

STATUS_DETAILS_KEY = "grpc-status-details-bin"


class RequestError(grpc.RpcError):
    """A call that did not succeed: `code` (a grpc.StatusCode), `message` (the server's,
    naming the field and the limit) and `field` (the request field, where it names one)."""

    def __init__(self, code: grpc.StatusCode, message: str, field: str | None = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.status, self.message, self.field = code, message, field

    def code(self) -> grpc.StatusCode:
        return self.status

    def details(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"RequestError({self.status.name}, {self.message!r}, field={self.field!r})"


def request_error(exc: grpc.RpcError) -> RequestError:
    """`exc` (grpc's, blocking or asyncio) as a RequestError."""
    if isinstance(exc, RequestError):
        return exc
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    message = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return RequestError(code, message, _field(trailers or ()))


@contextmanager
def request_errors() -> Iterator[None]:
    """What grpc raises inside, raised as a RequestError."""
    try:
        yield
    except grpc.RpcError as exc:
        if isinstance(exc, RequestError):
            raise
        raise request_error(exc) from exc


def _field(trailers: Iterable[tuple[str, str | bytes]]) -> str | None:
    """The first field violation of the rich status among `trailers`, if any."""
    for key, value in trailers:
        if key != STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            bad = error_details_pb2.BadRequest()
            if detail.Unpack(bad) and bad.field_violations:
                return bad.field_violations[0].field
    return None
