"""Every error the service raises on purpose, typed, in one module.

service/core/status.py maps these classes to gRPC status codes in one place;
everything else raises them with a message that names the field and the limit, the field
first ("options.attention.layers: 7 is outside [0, 4)", "inputs[1] has 1101 tokens, ...").
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

# The field a message names first: a path of names and indices, then ":" or " has ".
_FIELD = re.compile(r"([A-Za-z_]\w*(?:\[\d+\]|\.[A-Za-z_]\w*)*)(?::| has )")


class AttnserveError(Exception):
    """Base of the service's own errors. A request's field path, where its message names one
    first, is `field`; a protocol that names the field otherwise says it in its own words
    with `named`."""

    @property
    def field(self) -> str | None:
        return field_of(self)

    def named(self, names: Mapping[str, str]) -> AttnserveError:
        """This error with its field as a protocol names it: the longest path of `names`
        (the core's -> the protocol's) that the field begins with is replaced
        ({"options.interventions": "interventions"}: "options.interventions[0].hook: ..."
        -> "interventions[0].hook: ..."); itself where none is."""
        field = self.field
        if field is None:
            return self
        for path in sorted(names, key=len, reverse=True):
            if field == path or field.startswith((path + ".", path + "[")):
                return type(self)(names[path] + str(self)[len(path) :])
        return self


class InvalidInputError(AttnserveError):
    """The request is malformed or out of the model's limits (INVALID_ARGUMENT)."""


class ModelNotFoundError(AttnserveError):
    """A request named a model (or version) this server does not serve."""


class QueueFullError(AttnserveError):
    """Too many sequences queued; nothing of the request was queued (RESOURCE_EXHAUSTED)."""


class RequestTooLargeError(AttnserveError):
    """The request body is over the message size limit (HTTP 413)."""


class ResponseTooLargeError(AttnserveError):
    """The answer would exceed the message size limit (RESOURCE_EXHAUSTED)."""


class NotReadyError(AttnserveError):
    """The model is not warm yet, or the server is draining (UNAVAILABLE)."""


class DeadlineExceededError(AttnserveError):
    """The client's deadline passed while the work was queued (DEADLINE_EXCEEDED)."""


class UnauthenticatedError(AttnserveError):
    """A bearer token is required and was missing or wrong (UNAUTHENTICATED)."""


class InferenceError(AttnserveError):
    """ONNX Runtime failed while running a batch (INTERNAL)."""


class UnsupportedError(AttnserveError):
    """What this deployment of the server does not do (UNIMPLEMENTED)."""


class ModelLoadError(AttnserveError):
    """The model directory is missing, corrupt or inconsistent with its config (startup)."""


class ProviderUnavailableError(AttnserveError):
    """The execution provider asked for cannot start on this machine (startup)."""


def field_of(error: BaseException) -> str | None:
    """The request field an error names first, by this module's message convention; None
    where it names none."""
    match = _FIELD.match(str(error))
    return match.group(1) if match else None


@contextmanager
def fields_named(names: Mapping[str, str]) -> Iterator[None]:
    """Errors raised inside name their field as the request named it (AttnserveError.named:
    an API whose request says "interventions[0].hook" where the plan says
    "options.interventions[0].hook")."""
    try:
        yield
    except AttnserveError as exc:
        renamed = exc.named(names)
        if renamed is exc:
            raise
        raise renamed from exc
