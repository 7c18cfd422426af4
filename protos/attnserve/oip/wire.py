"""The Open Inference Protocol's tensors and parameters on the wire, written once.

The server (attnserve.service) and attnserve's client (attnserve.client.oip) read and
write the protocol's tensors with these functions, as tritonclient's `utils` module does for Triton:
the datatype table, the BYTES layout, sizes computed without overflow,
and parameters as Python values. A `WireError` names the field and what was wrong.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from attnserve.oip import grpc_service_pb2 as oip

# The protocol's tensor datatypes with a numpy equivalent, little-endian as on the wire.
# BYTES (length-prefixed elements) is read by unpack_bytes; BF16 has no numpy type.
DATATYPES: dict[str, np.dtype] = {
    name: np.dtype(code)
    for name, code in {
        "BOOL": "?",
        "UINT8": "<u1",
        "UINT16": "<u2",
        "UINT32": "<u4",
        "UINT64": "<u8",
        "INT8": "<i1",
        "INT16": "<i2",
        "INT32": "<i4",
        "INT64": "<i8",
        "FP16": "<f2",
        "FP32": "<f4",
        "FP64": "<f8",
    }.items()
}
BYTES = "BYTES"
INT64_MAX = 2**63 - 1  # shapes and int64 parameters; the protocol's gRPC shape is int64

Parameter = bool | int | float | str  # what InferParameter and JSON parameters hold


class WireError(ValueError):
    """A tensor or parameter that does not follow the protocol; the message names the field."""


def numpy_dtype(datatype: str, field: str) -> np.dtype:
    """The numpy dtype of a protocol datatype (not BYTES)."""
    dtype = DATATYPES.get(datatype)
    if dtype is None:
        raise WireError(
            f"{field}: {datatype!r} is not a numeric datatype of the protocol "
            f"({', '.join(DATATYPES)})"
        )
    return dtype


def element_count(shape: Sequence[int], field: str) -> int:
    """The number of elements of `shape`, in Python integers: no overflow, however large.
    Each dimension must be a non-negative int64."""
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or not 0 <= dim <= INT64_MAX:
            raise WireError(f"{field}: dimensions are integers in [0, 2^63), got {dim!r}")
    return math.prod(shape)


def byte_size(datatype: str, shape: Sequence[int], field: str) -> int:
    """The bytes a numeric tensor of `shape` takes on the wire."""
    return element_count(shape, field) * numpy_dtype(datatype, f"{field}.datatype").itemsize


def from_bytes(data: bytes | memoryview, datatype: str, shape: Sequence[int], field: str):
    """A numeric tensor's raw little-endian bytes as a read-only array of `shape` (no copy);
    the bytes must be exactly the shape's size."""
    expected = byte_size(datatype, shape, field)
    if len(data) != expected:
        raise WireError(
            f"{field}: a {datatype} tensor of shape {list(shape)} is {expected:,} bytes, "
            f"got {len(data):,}"
        )
    return np.frombuffer(data, dtype=DATATYPES[datatype]).reshape(shape)


def pack_bytes(items: Iterable[bytes]) -> bytes:
    """BYTES elements as the protocol lays them out: each a 4-byte little-endian length, then
    its bytes."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def unpack_bytes(data: bytes | memoryview, field: str) -> list[bytes]:
    """The elements of a BYTES tensor's raw contents (pack_bytes' inverse)."""
    data = bytes(data)
    items, offset = [], 0
    while offset < len(data):
        if offset + 4 > len(data):
            raise WireError(f"{field}: the contents end inside an element's 4-byte length")
        (size,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + size > len(data):
            raise WireError(f"{field}: an element of {size:,} bytes runs past the contents' end")
        items.append(data[offset : offset + size])
        offset += size
    return items


def parameters_from_proto(parameters: Mapping[str, oip.InferParameter]) -> dict[str, Parameter]:
    """A protobuf parameter map as Python values (an unset parameter is left out)."""
    values = {}
    for name, parameter in parameters.items():
        which = parameter.WhichOneof("parameter_choice")
        if which is not None:
            values[name] = getattr(parameter, which)
    return values


def write_parameter(parameter: oip.InferParameter, value: Parameter, field: str) -> None:
    """Set a protobuf parameter from a Python value of one of the protocol's types."""
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        if not -(2**63) <= value <= INT64_MAX:
            raise WireError(f"{field}: {value} is outside int64")
        parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    elif isinstance(value, str):
        parameter.string_param = value
    else:
        raise WireError(f"{field}: a bool, integer, number or string, got {value!r}")
