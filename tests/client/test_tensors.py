import numpy as np
import pytest

from attnserve.model.packing import pack_causal, packed_length, unpack_causal
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import (
    SplicedMessage,
    fill_tensor,
    from_tensor,
    nested,
    split_tensor_data,
    to_tensor,
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


def spliced_result(rng: np.random.Generator) -> tuple[SplicedMessage, pb.EncodeResult]:
    """The same EncodeResult twice: its tensors put through SplicedMessage, and filled in
    the plain way (the reference). Large tensors at each depth, a small one, float16."""
    tensors = {
        "embeddings": (rng.standard_normal((4, 8)), pb.DTYPE_FLOAT32),  # small: inline
        "attention": (rng.random((2, 3, 128, 128)), pb.DTYPE_FLOAT16),
        "attribution.heads": (rng.standard_normal((1, 2, 64, 128)), pb.DTYPE_FLOAT32),
        "logit_lens.logits": (rng.standard_normal((3, 1, 9000)), pb.DTYPE_FLOAT32),
    }
    spliced, plain = SplicedMessage(pb.EncodeResult(token_ids=[5, 6])), pb.EncodeResult()
    plain.CopyFrom(spliced.message)
    for path, (array, dtype) in tensors.items():
        spliced.put(path, array, dtype)
        *parents, name = path.split(".")
        message = plain
        for parent in parents:
            message = getattr(message, parent)
        fill_tensor(getattr(message, name), array, dtype)
    return spliced, plain


def test_spliced_tensors_parse_as_the_message_with_them_filled_in():
    spliced, plain = spliced_result(np.random.default_rng(2))
    # the large ones are not in the message ...
    assert spliced.message.attention.data == b"" and spliced.message.embeddings.data
    assert spliced.message.attention.shape == plain.attention.shape
    # ... but in its bytes, where protobuf's own parser finds them
    parsed = pb.EncodeResult.FromString(b"".join(spliced.parts()))
    assert parsed == plain
    np.testing.assert_array_equal(
        from_tensor(parsed.logit_lens.logits), from_tensor(plain.logit_lens.logits)
    )
    assert spliced.filled() == plain


def test_nested_fields_are_framed_as_the_encoding_guide_shows():
    # field 1 holding field 2 holding "abc": key 0x0a, length 5, key 0x12, length 3
    assert b"".join(nested((1, 2), [b"abc"])) == bytes.fromhex("0a051203") + b"abc"
    # 300 as a varint is ac 02 (the guide's own example)
    assert b"".join(nested((1,), [b"x" * 300])) == bytes.fromhex("0aac02") + b"x" * 300


def test_the_large_tensors_bytes_are_split_off_and_read_in_place():
    spliced, plain = spliced_result(np.random.default_rng(3))
    number = {name: f.number for name, f in pb.EncodeResult.DESCRIPTOR.fields_by_name.items()}
    attribution = pb.LogitAttribution.DESCRIPTOR.fields_by_name["heads"].number
    lens = pb.TokenPredictions.DESCRIPTOR.fields_by_name["logits"].number
    without = pb.EncodeResult()  # the reference with the large tensors' bytes left out
    without.CopyFrom(plain)
    for tensor in (without.attention, without.attribution.heads, without.logit_lens.logits):
        tensor.ClearField("data")
    for raw in (b"".join(spliced.parts()), plain.SerializeToString()):  # spliced or not
        rest, found = split_tensor_data(raw, pb.EncodeResult)
        assert pb.EncodeResult.FromString(rest) == without  # lengths around them rewritten
        assert len(rest) < len(raw) - sum(len(view) for view in found.values()) + 64
        assert set(found) == {
            (number["attention"],),
            (number["attribution"], attribution),
            (number["logit_lens"], lens),
        }  # the small embeddings stay with the parsed message
        for path, message in (
            ((number["attention"],), plain.attention),
            ((number["attribution"], attribution), plain.attribution.heads),
            ((number["logit_lens"], lens), plain.logit_lens.logits),
        ):
            assert found[path].obj is raw  # a view of the received bytes: nothing copied
            np.testing.assert_array_equal(from_tensor(message, found[path]), from_tensor(message))


def test_an_answer_without_large_tensors_is_parsed_as_it_came():
    result = pb.EncodeResult(token_ids=list(range(100)))
    fill_tensor(result.embeddings, np.ones((100, 8)))  # 3.2 KB
    raw = result.SerializeToString()
    assert split_tensor_data(raw, pb.EncodeResult) == (raw, {})
    above = result.embeddings.ByteSize() + 1  # the answer reaches it, none of its fields
    assert len(raw) >= above
    assert split_tensor_data(raw, pb.EncodeResult, min_bytes=above) == (raw, {})  # scanned
