"""Python client of attnserve: `from attnserve.client import EncoderClient`. Torch-free.

A process that asks for large attention maps again and again can call `keep_freed_heap()`
once, before its first call, so that each answer decodes into the pages the last one freed
(the server's own heap policy; `give_back_memory()` returns them when done).
"""

from attnserve.client.client import AsyncEncoderClient, ClientOptions, EncoderClient
from attnserve.client.codec import EncodeOutput, Encoding
from attnserve.client.errors import RequestError
from attnserve.client.oip import OipClient
from attnserve.client.request import build_request
from attnserve.service.core.memory import give_back_memory, keep_freed_heap

InferenceClient = OipClient  # its earlier name, kept for code written against it

__all__ = [
    "AsyncEncoderClient",
    "ClientOptions",
    "EncodeOutput",
    "EncoderClient",
    "Encoding",
    "InferenceClient",
    "OipClient",
    "RequestError",
    "build_request",
    "give_back_memory",
    "keep_freed_heap",
]
