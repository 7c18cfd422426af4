import numpy as np
import pytest

from attnserve.client.codec import parse_response
from attnserve.client.request import build_request
from attnserve.model.packing import pack_causal, packed_length
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import (
    fill_tensor,
)


def test_single_text_single_ids_and_lists():
    assert [i.text for i in build_request("one").inputs] == ["one"]
    assert [list(i.token_ids.ids) for i in build_request([1, 2]).inputs] == [[1, 2]]
    assert [list(i.token_ids.ids) for i in build_request(np.array([3, 4])).inputs] == [[3, 4]]
    mixed = build_request(["a", [5, 6]]).inputs
    assert mixed[0].text == "a" and list(mixed[1].token_ids.ids) == [5, 6]


def test_options_map_to_the_proto():
    request = build_request(
        "x",
        layers=[1],
        heads=[0],
        attention_dtype="float16",
        attention_layout="causal-packed",
        pooling="last",
        token_embeddings=False,
        truncate=True,
        request_id="r",
    )
    o = request.options
    assert request.request_id == "r"
    assert (o.pooling, o.skip_token_embeddings, o.truncation) == (
        pb.POOLING_LAST,
        True,
        pb.TRUNCATION_RIGHT,
    )
    assert list(o.attention.layers) == [1] and list(o.attention.heads) == [0]
    assert o.attention.dtype == pb.DTYPE_FLOAT16
    assert o.attention.layout == pb.ATTENTION_LAYOUT_CAUSAL_PACKED
    assert not build_request("x").options.HasField("attention")


def test_bad_choices_are_refused_before_sending():
    with pytest.raises(ValueError, match="pooling must be one of"):
        build_request("x", pooling="max")
    with pytest.raises(ValueError, match="attention_dtype must be one of"):
        build_request("x", attention=True, attention_dtype="bfloat16")


def test_an_answers_repr_stays_short_however_large_its_tensors():
    """A repr (a debugger, a log line, a finished task's) must not print the received message:
    protobuf's text format of a 286 MB map took the client 100 s."""
    attention = np.random.default_rng(0).random((2, 3, 128, 128))  # 384 KB as float32
    response = pb.EncodeResponse(results=[pb.EncodeResult(token_ids=list(range(128)))])
    fill_tensor(response.results[0].attention, attention)
    output = parse_response(response.SerializeToString())
    np.testing.assert_allclose(output[0].attention, attention, rtol=1e-6)
    assert len(repr(output)) < 10_000  # numpy summarises the arrays; the message is left out


def test_causal_packed_attention_kept_packed_is_read_in_place():
    """unpack_attention=False: the packed weights as they came, no copy of the received bytes;
    unpacked_attention() gives what the default decoding gives."""
    t = 200
    full = np.tril(np.random.default_rng(1).random((2, 3, t, t))).astype(np.float16)
    response = pb.EncodeResponse(results=[pb.EncodeResult(token_ids=list(range(t)))])
    fill_tensor(response.results[0].attention, pack_causal(full), pb.DTYPE_FLOAT16)  # 241 KB
    raw = response.SerializeToString()
    kept = parse_response(raw, unpack_attention=False)[0]
    assert kept.attention.shape == (2, 3, packed_length(t)) and kept.attention.dtype == np.float16
    assert not kept.attention.flags.owndata and not kept.attention.flags.writeable
    np.testing.assert_array_equal(kept.attention, pack_causal(full))
    np.testing.assert_array_equal(kept.unpacked_attention(), full)
    np.testing.assert_array_equal(parse_response(raw)[0].attention, full)
