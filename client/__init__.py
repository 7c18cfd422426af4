"""Python client of attnserve: `from attnserve.client import EncoderClient`. Torch-free."""

from attnserve.client.client import AsyncEncoderClient, ClientOptions, EncoderClient
from attnserve.client.codec import EncodeOutput, Encoding, build_request
from attnserve.client.oip import InferenceClient

__all__ = [
    "AsyncEncoderClient",
    "ClientOptions",
    "EncodeOutput",
    "EncoderClient",
    "Encoding",
    "InferenceClient",
    "build_request",
]
