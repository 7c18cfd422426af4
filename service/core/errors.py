"""Every error the service raises on purpose, typed, in one module.

service/core/status.py maps these classes to gRPC status codes in one place;
everything else raises them with a message that names the field and the limit, the field
first ("options.attention.layers: 7 is outside [0, 4)", "inputs[1] has 1101 tokens, ...").
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

# The field a message names first: a path of names and indices, then ":" or " has ".
_FIELD = re.compile(r"([A-Za-z_]\w*(?:\[\d+\]|\.[A-Za-z_]\w*)*)(?::| has )")


class AttnserveError(Exception):
    """Base of the service's own errors."""


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


def word(name: str) -> re.Pattern[str]:
    """`name` as a whole field name in a message (not inside a longer one)."""
    return re.compile(r"(?<![\w.])" + re.escape(name) + r"(?!\w)")


@contextmanager
def renamed(*renames: tuple[re.Pattern[str], str]) -> Iterator[None]:
    """Errors raised inside name fields as the request named them: each pattern of
    `renames` in their messages replaced by its name (an API whose request says
    "interventions[0].hook" where the plan says "options.interventions[0].hook")."""
    try:
        yield
    except AttnserveError as exc:
        message = str(exc)
        for pattern, name in renames:
            message = pattern.sub(name, message)
        if message == str(exc):
            raise
        raise type(exc)(message) from exc
