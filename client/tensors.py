"""numpy <-> attnserve.v1.Tensor, and the causal-packed attention layout.

Used by both ends of the wire: the server encodes with these functions and the
client decodes with them, so the format is defined once.
"""

from __future__ import annotations

import numpy as np

from attnserve.v1 import encoder_service_pb2 as pb

NUMPY_DTYPES = {pb.DTYPE_FLOAT32: np.dtype("<f4"), pb.DTYPE_FLOAT16: np.dtype("<f2")}


def to_tensor(array: np.ndarray, dtype: int = pb.DTYPE_FLOAT32) -> pb.Tensor:
    """Raw little-endian bytes of `array` converted to `dtype` (a Dtype enum value)."""
    data = np.ascontiguousarray(array, dtype=NUMPY_DTYPES[dtype])
    return pb.Tensor(shape=data.shape, dtype=dtype, data=data.tobytes())


def from_tensor(tensor: pb.Tensor) -> np.ndarray:
    """The array a Tensor carries, in its own dtype; ValueError if the bytes do not fit."""
    if tensor.dtype not in NUMPY_DTYPES:
        raise ValueError(f"unsupported tensor dtype {tensor.dtype}")
    dtype = NUMPY_DTYPES[tensor.dtype]
    shape = tuple(tensor.shape)
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(tensor.data) != expected:
        raise ValueError(f"tensor of shape {shape} needs {expected} bytes, has {len(tensor.data)}")
    return np.frombuffer(tensor.data, dtype=dtype).reshape(shape)


def packed_length(seq_len: int) -> int:
    """Entries of a T x T lower triangle, diagonal included: T (T + 1) / 2."""
    return seq_len * (seq_len + 1) // 2


def pack_causal(attention: np.ndarray) -> np.ndarray:
    """(..., T, T) -> (..., T (T + 1) / 2): the lower triangle, row by row."""
    rows, cols = np.tril_indices(attention.shape[-1])
    return attention[..., rows, cols]


def unpack_causal(packed: np.ndarray, seq_len: int) -> np.ndarray:
    """(..., T (T + 1) / 2) -> (..., T, T) float32, zeros above the diagonal."""
    if packed.shape[-1] != packed_length(seq_len):
        raise ValueError(
            f"packed attention has {packed.shape[-1]} entries per head, "
            f"a length of {seq_len} needs {packed_length(seq_len)}"
        )
    full = np.zeros((*packed.shape[:-1], seq_len, seq_len), dtype=np.float32)
    rows, cols = np.tril_indices(seq_len)
    full[..., rows, cols] = packed
    return full
