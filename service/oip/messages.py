"""An Open Inference Protocol request and response as Python values: what both transports
translate to and from (protobuf on gRPC, JSON and binary on HTTP), so nothing in between
is protobuf.

Numeric tensors are numpy arrays, BYTES tensors lists of bytes; a tensor in a client's
shared-memory region has no data (its parameters say where it is).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from attnserve.oip.wire import Parameter, WireError
from attnserve.service.core.errors import InvalidInputError

SHM_REGION = "shared_memory_region"
SHM_OFFSET = "shared_memory_offset"
SHM_SIZE = "shared_memory_byte_size"
SHM_PARAMETERS = (SHM_REGION, SHM_OFFSET, SHM_SIZE)


@contextlib.contextmanager
def wire_errors() -> Iterator[None]:
    """The wire's errors (which name the field) as the data plane's InvalidInputError: the
    one place both transports map them."""
    try:
        yield
    except WireError as exc:
        raise InvalidInputError(str(exc)) from None


def in_shared_memory(parameters: dict[str, Parameter]) -> bool:
    """Whether a tensor's parameters place it in a shared-memory region (either of the two
    required ones is enough to say so; SharedMemoryRegistry.locate wants both)."""
    return SHM_REGION in parameters or SHM_SIZE in parameters


@dataclass
class InputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | list[bytes] | None  # None: in shared memory
    parameters: dict[str, Parameter] = field(default_factory=dict)

    @property
    def in_shared_memory(self) -> bool:
        return in_shared_memory(self.parameters)


@dataclass
class RequestedOutput:
    name: str
    parameters: dict[str, Parameter] = field(default_factory=dict)

    @property
    def in_shared_memory(self) -> bool:
        return in_shared_memory(self.parameters)


@dataclass
class InferRequest:
    model_name: str
    model_version: str = ""
    id: str = ""
    parameters: dict[str, Parameter] = field(default_factory=dict)
    inputs: list[InputTensor] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)


@dataclass
class OutputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | None  # None: written into the client's shared-memory region
    parameters: dict[str, Parameter] = field(default_factory=dict)


@dataclass
class InferResponse:
    model_name: str
    model_version: str
    id: str
    parameters: dict[str, Parameter]
    outputs: list[OutputTensor]
