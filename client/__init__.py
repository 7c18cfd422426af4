"""Python client of attnserve: `from client import EncoderClient`. Torch-free."""

from client.client import AsyncEncoderClient, ClientOptions, EncoderClient
from client.codec import EncodeOutput, Encoding, build_request

__all__ = [
    "AsyncEncoderClient",
    "ClientOptions",
    "EncodeOutput",
    "EncoderClient",
    "Encoding",
    "build_request",
]
