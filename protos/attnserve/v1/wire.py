"""numpy <-> attnserve.v1.Tensor, and the causal-packed attention layout.

Used by both ends of the wire: the server encodes with these functions and the
client decodes with them, so the format is defined once.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from attnserve.v1 import encoder_service_pb2 as pb


def choices(enum, prefix: str) -> dict[str, int]:
    """A .proto enum's values by their names in lower case without `prefix` (and without
    UNSPECIFIED): the words the clients, the CLI and V2's parameters use for them."""
    return {
        name.removeprefix(prefix).lower(): number
        for name, number in enum.items()
        if not name.endswith("_UNSPECIFIED")
    }


POOLINGS = cast(dict[str, pb.Pooling], choices(pb.Pooling, "POOLING_"))
HEAD_REDUCTIONS = cast(  # none, mean, max
    dict[str, pb.HeadReduction], choices(pb.HeadReduction, "HEAD_REDUCTION_")
)
LAYOUTS = cast(  # full, causal_packed
    dict[str, pb.AttentionLayout], choices(pb.AttentionLayout, "ATTENTION_LAYOUT_")
)
# LogitAttribution's tensors in the .proto's order: the parts that add up to a logit
ATTRIBUTION_PARTS = tuple(
    field.name
    for field in pb.LogitAttribution.DESCRIPTOR.fields
    if field.message_type is pb.Tensor.DESCRIPTOR
)
NUMPY_DTYPES: dict[int, np.dtype] = {
    pb.DTYPE_FLOAT32: np.dtype("<f4"),
    pb.DTYPE_FLOAT16: np.dtype("<f2"),
    pb.DTYPE_INT32: np.dtype("<i4"),
}


def fill_tensor(tensor: pb.Tensor, array: np.ndarray, dtype: pb.Dtype = pb.DTYPE_FLOAT32) -> None:
    """Write `array`, converted to `dtype` (a Dtype value), into `tensor` in place.

    In place, because copying a finished Tensor into its parent message
    (CopyFrom) copies all its bytes once more: tens of ms for attention maps.
    """
    data = np.ascontiguousarray(array, dtype=NUMPY_DTYPES[dtype])
    tensor.shape[:] = data.shape
    tensor.dtype = dtype
    tensor.data = data.tobytes()


def to_tensor(array: np.ndarray, dtype: pb.Dtype = pb.DTYPE_FLOAT32) -> pb.Tensor:
    """A new Tensor holding `array` as `dtype`."""
    tensor = pb.Tensor()
    fill_tensor(tensor, array, dtype)
    return tensor


def from_tensor(tensor: pb.Tensor) -> np.ndarray:
    """The array a Tensor carries, in its own dtype; ValueError if the bytes do not fit."""
    if tensor.dtype not in NUMPY_DTYPES:
        raise ValueError(f"unsupported tensor dtype {tensor.dtype}")
    dtype = NUMPY_DTYPES[tensor.dtype]
    shape = tuple(tensor.shape)
    expected = math.prod(shape) * dtype.itemsize  # math.prod: exact, and no numpy call
    if len(tensor.data) != expected:
        raise ValueError(f"tensor of shape {shape} needs {expected} bytes, has {len(tensor.data)}")
    return np.frombuffer(tensor.data, dtype=dtype).reshape(shape)


def packed_length(seq_len: int) -> int:
    """Entries of a T x T lower triangle, diagonal included: T (T + 1) / 2."""
    return seq_len * (seq_len + 1) // 2


# Both directions copy one row slice at a time: T slice copies beat one fancy
# index over T (T + 1) / 2 positions by 3-6x at T = 512.


def pack_causal(attention: np.ndarray) -> np.ndarray:
    """(..., T, T) -> (..., T (T + 1) / 2): the lower triangle, row by row."""
    t = attention.shape[-1]
    packed = np.empty((*attention.shape[:-2], packed_length(t)), dtype=attention.dtype)
    start = 0
    for row in range(t):
        packed[..., start : start + row + 1] = attention[..., row, : row + 1]
        start += row + 1
    return packed


def unpack_causal(packed: np.ndarray, seq_len: int) -> np.ndarray:
    """(..., T (T + 1) / 2) -> (..., T, T) in packed's dtype, zeros above the diagonal."""
    if packed.shape[-1] != packed_length(seq_len):
        raise ValueError(
            f"packed attention has {packed.shape[-1]} entries per head, "
            f"a length of {seq_len} needs {packed_length(seq_len)}"
        )
    full = np.zeros((*packed.shape[:-1], seq_len, seq_len), dtype=packed.dtype)
    start = 0
    for row in range(seq_len):
        full[..., row, : row + 1] = packed[..., start : start + row + 1]
        start += row + 1
    return full
