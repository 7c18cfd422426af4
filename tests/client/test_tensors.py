import numpy as np
import pytest

from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import (
    from_tensor,
    pack_causal,
    packed_length,
    to_tensor,
    unpack_causal,
)


def causal_weights(layers=2, heads=3, t=7, seed=0):
    rng = np.random.default_rng(seed)
    w = np.tril(rng.random((layers, heads, t, t))).astype(np.float32)
    return w / w.sum(-1, keepdims=True)


def test_tensor_round_trip_is_bit_exact_for_float32():
    array = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    tensor = to_tensor(array)
    assert list(tensor.shape) == [3, 5] and tensor.dtype == pb.DTYPE_FLOAT32
    assert len(tensor.data) == array.nbytes
    np.testing.assert_array_equal(from_tensor(tensor), array)


def test_float16_halves_the_bytes_within_half_precision():
    array = causal_weights()
    tensor = to_tensor(array, pb.DTYPE_FLOAT16)
    assert len(tensor.data) == array.nbytes // 2
    np.testing.assert_allclose(from_tensor(tensor), array, atol=5e-4)


@pytest.mark.parametrize("t", [1, 2, 9])
def test_causal_packing_round_trip(t):
    weights = causal_weights(t=t)
    packed = pack_causal(weights)
    assert packed.shape == (2, 3, packed_length(t))
    np.testing.assert_array_equal(unpack_causal(packed, t), weights)


def test_packed_rows_are_the_lower_triangle_row_by_row():
    w = np.arange(9, dtype=np.float32).reshape(3, 3)
    assert pack_causal(w).tolist() == [0, 3, 4, 6, 7, 8]


def test_malformed_tensors_are_refused():
    with pytest.raises(ValueError, match=r"needs 24 bytes, has 4"):
        from_tensor(pb.Tensor(shape=[2, 3], dtype=pb.DTYPE_FLOAT32, data=b"\0" * 4))
    with pytest.raises(ValueError, match="unsupported tensor dtype"):
        from_tensor(pb.Tensor(shape=[1], dtype=pb.DTYPE_UNSPECIFIED, data=b"\0" * 4))
    with pytest.raises(ValueError, match="a length of 4 needs 10"):
        unpack_causal(np.zeros((1, 9)), 4)
