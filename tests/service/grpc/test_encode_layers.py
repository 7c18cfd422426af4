"""EncodeLayers: the response first, then each input's attention weights one layer per
message; together they are Encode's answer, and only the largest message must fit."""

import asyncio
import contextlib
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from attnserve.client import AsyncEncoderClient, ClientOptions, EncoderClient
from tests.conftest import ServerThread

IDS = [list(range(1, 120)), list(range(7, 60))]
PACKED = {"attention": True, "attention_dtype": "float16", "attention_layout": "causal-packed"}


def test_the_layers_make_up_encodes_attention(client, server):
    before = server.metric("attnserve_requests_total", {"method": "EncodeLayers", "code": "OK"})
    by_layer = client.encode_layers(IDS, **PACKED)
    whole = client.encode(IDS, unpack_attention=False, **PACKED)
    for ours, theirs in zip(by_layer, whole, strict=True):
        assert ours.attention is None and len(ours.attention_by_layer) == 2  # the small model's
        np.testing.assert_array_equal(np.stack(ours.attention_by_layer), theirs.attention)
        np.testing.assert_array_equal(ours.embeddings, theirs.embeddings)
        assert ours.layers == theirs.layers and ours.heads == theirs.heads
    # the same bytes of weights, plus each layer's message around them
    assert by_layer.wire_bytes == pytest.approx(whole.wire_bytes, rel=0.01)
    after = server.metric("attnserve_requests_total", {"method": "EncodeLayers", "code": "OK"})
    assert after == before + 1


def test_the_asyncio_client_reads_the_same_layers(client, server):
    async def by_layer():
        async with AsyncEncoderClient(server.address) as c:
            return await c.encode_layers(IDS, **PACKED)

    answers = asyncio.run(by_layer()), client.encode_layers(IDS, **PACKED)
    for ours, theirs in zip(*answers, strict=True):
        assert len(ours.attention_by_layer) == len(theirs.attention_by_layer) == 2
        for a, b in zip(ours.attention_by_layer, theirs.attention_by_layer, strict=True):
            np.testing.assert_array_equal(a, b)


def test_selected_layers_and_heads_in_full(client):
    options = {"attention": True, "layers": [1], "heads": [0, 2], "rows": [0, 5, 9]}
    by_layer = client.encode_layers(IDS, **options)
    whole = client.encode(IDS, **options)
    for ours, theirs in zip(by_layer, whole, strict=True):
        [layer] = ours.attention_by_layer
        assert layer.shape == (2, 3, len(theirs.token_ids)) and layer.dtype == np.float32
        np.testing.assert_array_equal(layer, theirs.attention[0])
        assert ours.rows == theirs.rows == [0, 5, 9]


def test_with_readouts_the_layers_are_the_masked_models(client):
    options = {"attention": True, "head_mask": {(0, 1): 0.0}, "hidden_states": True}
    [ours] = client.encode_layers([IDS[0]], **options)
    [theirs] = client.encode([IDS[0]], **options)
    np.testing.assert_array_equal(np.stack(ours.attention_by_layer), theirs.attention)
    np.testing.assert_array_equal(ours.hidden_states, theirs.hidden_states)


def test_without_attention_the_response_comes_alone(client):
    [encoding] = client.encode_layers([IDS[0]])
    assert encoding.attention is None and encoding.attention_by_layer == []
    np.testing.assert_array_equal(encoding.embeddings, client.encode([IDS[0]])[0].embeddings)


def test_bad_input_ends_the_stream_with_its_status_and_the_server_keeps_serving(client):
    with pytest.raises(grpc.RpcError) as error:
        client.encode_layers([[1, 2, 100_000]], **PACKED)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "token_ids" in error.value.details()
    assert len(client.encode_layers([[1, 2, 3]], **PACKED)[0].attention_by_layer) == 2


@contextlib.contextmanager
def client_with_limit(model_dir, runtime, max_message_bytes: int) -> Iterator[EncoderClient]:
    """A client of a server of its own whose messages may weigh `max_message_bytes`."""
    server = ServerThread(model_dir, runtime, max_message_bytes=max_message_bytes)
    try:
        with EncoderClient(server.address, ClientOptions(timeout_s=60)) as client:
            yield client
    finally:
        server.stop()


def test_only_the_largest_message_must_fit(small_model_dir, small_runtime):
    """The 119-token float32 map of 2 layers x 4 heads is 453 KB, each layer 227 KB: over a
    300 KB message limit Encode refuses it, EncodeLayers answers; under 200 KB neither."""
    with client_with_limit(small_model_dir, small_runtime, 300_000) as client:
        with pytest.raises(grpc.RpcError) as error:
            client.encode([IDS[0]], attention=True)
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        layers = client.encode_layers([IDS[0]], attention=True)[0].attention_by_layer
        assert [layer.shape for layer in layers] == [(4, 119, 119)] * 2
    with client_with_limit(small_model_dir, small_runtime, 200_000) as client:
        with pytest.raises(grpc.RpcError) as error:
            client.encode_layers([IDS[0]], attention=True)
        assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "the largest message of the response" in error.value.details()
        assert "200,000-byte message limit" in error.value.details()
