"""Every error the service raises on purpose, typed, in one module.

service/core/status.py maps these classes to gRPC status codes in one place;
everything else raises them with a message that names the field and the limit.
"""


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
