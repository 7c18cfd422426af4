"""Every error the service raises on purpose, typed, in one module.

The gRPC layer maps these classes to status codes in one place; everything
else raises them with a message that names the field and the limit.
"""


class AttnserveError(Exception):
    """Base of the service's own errors."""


class InvalidInputError(AttnserveError):
    """The request is malformed or out of the model's limits (INVALID_ARGUMENT)."""


class ModelLoadError(AttnserveError):
    """The model directory is missing, corrupt or inconsistent with its config (startup)."""


class ProviderUnavailableError(AttnserveError):
    """The execution provider asked for cannot start on this machine (startup)."""


class InferenceError(AttnserveError):
    """ONNX Runtime failed while running a batch (INTERNAL)."""
