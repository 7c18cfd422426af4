"""What the client raises when a call is refused: its own RequestError (still a
grpc.RpcError), with the status code, the server's message and the request field, which
the server sends in gRPC's rich error model (so other gRPC clients can read it too)."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from attnserve.client import AsyncEncoderClient, ClientOptions, RequestError
from tests.conftest import SMALL_CONFIG


def test_a_refused_encode_raises_the_clients_error_naming_the_field(client):
    with pytest.raises(RequestError) as caught:
        client.encode("The cat", attention=True, layers=[7])
    error = caught.value
    assert isinstance(error, grpc.RpcError)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.field == "options.attention.layers"
    assert error.details().startswith("options.attention.layers: 7 is outside")
    assert repr(error).startswith("RequestError(INVALID_ARGUMENT, 'options.attention.layers:")


def test_generate_and_the_async_client_raise_it_too(server, client):
    with pytest.raises(RequestError) as caught:
        list(client.generate("The cat", max_tokens=10**6))
    assert caught.value.field == "max_tokens"

    async def refused() -> RequestError:
        async with AsyncEncoderClient(server.address, ClientOptions(timeout_s=60)) as c:
            with pytest.raises(RequestError) as caught:
                await c.encode([[1, SMALL_CONFIG.vocab_size]])
            return caught.value

    error = asyncio.run(refused())
    assert error.field == "inputs[0].token_ids" and "outside the vocabulary" in error.details()


def test_the_field_travels_in_the_rich_status_for_any_grpc_client(server):
    """A plain grpc stub, no attnserve client: the google.rpc.Status trailer holds a
    BadRequest whose field violation names the field."""
    from attnserve.v1 import encoder_service_pb2 as pb
    from attnserve.v1 import encoder_service_pb2_grpc as pb_grpc

    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.EncoderServiceStub(channel)
        request = pb.EncodeRequest(inputs=[pb.Input(token_ids=pb.TokenIds(ids=[]))])
        with pytest.raises(grpc.RpcError) as caught:
            stub.Encode(request, timeout=60)
    trailer = dict(caught.value.trailing_metadata())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(trailer)
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    assert bad.field_violations[0].field == "inputs[0].token_ids"
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
