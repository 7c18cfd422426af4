"""OipClient (the Open Inference Protocol) against the real in-process server: through a
shared-memory region on this host, over the wire when the server cannot open the region, the
same numbers as Encode."""

from __future__ import annotations

import numpy as np
import pytest

from attnserve.client import ClientOptions, OipClient
from attnserve.oip import grpc_service_pb2 as oip

ROWS = [[3, 1, 4, 1, 5, 9, 2], [6, 5, 3]]  # ragged: the second row is padded by the client


@pytest.fixture
def encoded(client):
    return client.encode(ROWS, attention=True).encodings


def _check_against_encode(out: dict, encoded) -> None:
    assert out["lengths"].tolist() == [7, 3]
    for i, enc in enumerate(encoded):
        t = len(ROWS[i])
        np.testing.assert_allclose(out["embeddings"][i, :t], enc.embeddings, atol=1e-6)
        np.testing.assert_allclose(out["attention"][i, ..., :t, :t], enc.attention, atol=1e-6)
        assert not out["embeddings"][i, t:].any()  # rows past a length are zeros


def test_outputs_come_through_a_shared_memory_region(server, encoded):
    outputs = ["embeddings", "attention", "lengths"]
    with OipClient(server.address, ClientOptions(timeout_s=60)) as client:
        out = client.infer(input_ids=ROWS, outputs=outputs)
        assert client.uses_shared_memory
        region = client._region
        assert region.path.exists()
        registered = client._stub.SystemSharedMemoryStatus(oip.SystemSharedMemoryStatusRequest())
        assert region.name in registered.regions
        _check_against_encode(out, encoded)
        again = client.infer(input_ids=ROWS, outputs=outputs)  # the region is reused
        np.testing.assert_array_equal(again["attention"], out["attention"])
    assert not region.path.exists()  # closed: unregistered and unlinked
    with OipClient(server.address) as other:
        status = other._stub.SystemSharedMemoryStatus(oip.SystemSharedMemoryStatusRequest())
        assert region.name not in status.regions


def test_a_region_the_server_cannot_open_falls_back_to_the_wire(server, encoded, tmp_path):
    # Objects under tmp_path are invisible to the server, as another host's memory would be.
    options = ClientOptions(timeout_s=60)
    with OipClient(server.address, options, shared_memory_root=tmp_path) as client:
        out = client.infer(input_ids=ROWS, outputs=["embeddings", "attention", "lengths"])
        assert not client.uses_shared_memory
        assert not list(tmp_path.iterdir())  # the object it tried is gone
        _check_against_encode(out, encoded)


def test_text_and_parameters_match_encode_on_both_paths(server, client):
    expected = client.encode(
        ["hello", "hi"], attention=True, layers=[1], attention_dtype="float16"
    ).encodings
    for shared in (True, False):
        with OipClient(server.address, shared_memory=shared) as v2:
            out = v2.infer(
                text=["hello", "hi"],
                outputs=["attention", "lengths"],
                attention_layers=[1],
                attention_dtype="FP16",
            )
            assert v2.uses_shared_memory is shared
        assert out["attention"].dtype == np.float16
        for i, enc in enumerate(expected):
            t = int(out["lengths"][i])
            np.testing.assert_array_equal(out["attention"][i, ..., :t, :t], enc.attention)


def test_the_region_grows_with_the_requests(server):
    with OipClient(server.address) as client:
        client.infer(input_ids=[[1, 2]], outputs=["attention"])
        small = client._region.size
        long_row = list(range(1, 33))
        out = client.infer(input_ids=[long_row] * 3, outputs=["attention"])
        assert client._region.size > small
        assert out["attention"].shape[0] == 3 and out["attention"].shape[-1] == 32
