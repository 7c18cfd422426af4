"""Overload and deadlines: refuse fast and queue nothing; never run work nobody waits for."""

import asyncio

import grpc
import numpy as np
import pytest

from attnserve.client import AsyncEncoderClient, ClientOptions
from tests.conftest import ServerThread
from tests.service.fakes import FakeBackend


@pytest.fixture
def small_queue_server(default_export):
    # The default model: a 1024-token sequence takes ~90 ms here, so a burst
    # arrives far faster than the model drains it, on any machine we run on.
    running = ServerThread(default_export[0], max_queue=8)
    yield running
    running.stop()


def test_a_burst_larger_than_the_queue(small_queue_server):
    server = small_queue_server
    runtime = server.running.backend
    rng = np.random.default_rng(3)
    sequences = [rng.integers(0, 259, size=1024).tolist() for _ in range(40)]

    async def one(client, ids):
        try:
            out = await client.encode([ids])
        except grpc.RpcError as exc:
            return exc.code(), exc.details()
        return out, None

    async def burst():
        options = ClientOptions(retries=0, timeout_s=120)
        async with AsyncEncoderClient(server.address, options) as client:
            return await asyncio.gather(*(one(client, ids) for ids in sequences))

    results = asyncio.run(burst())
    refused = [r for r in results if r[0] == grpc.StatusCode.RESOURCE_EXHAUSTED]
    answered = [(ids, r) for ids, r in zip(sequences, results, strict=True) if r[1] is None]
    assert refused, "the burst never filled the queue"
    assert len(answered) >= 8
    assert len(refused) + len(answered) == len(sequences)  # no other outcome
    assert "queue full" in refused[0][1] and "the limit is 8" in refused[0][1]
    # Nothing of a refused request was queued: the model ran exactly the answered ones.
    assert server.metric("attnserve_sequences_total") == len(answered)
    for ids, (out, _) in answered:
        embeddings = runtime.embed(np.array([ids]))
        np.testing.assert_allclose(out[0].embeddings, embeddings[0], atol=1e-5)


def test_a_refusal_does_not_wait_for_the_model(small_model_dir):
    """With the model held busy, a full queue answers RESOURCE_EXHAUSTED at once."""
    backend = FakeBackend()
    server = ServerThread(small_model_dir, backend, max_queue=2)
    try:

        async def scenario():
            async with AsyncEncoderClient(server.address, ClientOptions(retries=0)) as client:
                backend.gate.clear()  # the model is stuck until the end of the scenario
                running = asyncio.ensure_future(client.encode([[1, 2]]))
                await asyncio.to_thread(backend.wait_calls, 1)  # inside the model
                queued = asyncio.ensure_future(client.encode([[3], [4]]))  # fills the queue
                while server.running.engine.depth < 2:
                    await asyncio.sleep(0.001)
                with pytest.raises(grpc.RpcError) as refused:
                    await client.encode([[5]])
                stuck = not backend.gate.is_set()
                backend.gate.set()
                await asyncio.gather(running, queued)
                return refused.value, stuck

        refused, stuck = asyncio.run(scenario())
        assert stuck  # the refusal came back while the model was still busy
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "queue full" in refused.details()
    finally:
        server.stop()


def test_a_deadline_that_expires_in_the_queue_costs_no_model_work(small_model_dir):
    backend = FakeBackend()
    server = ServerThread(small_model_dir, backend)
    try:

        async def scenario():
            async with AsyncEncoderClient(server.address, ClientOptions(retries=0)) as client:
                backend.gate.clear()
                busy = asyncio.ensure_future(client.encode([[1, 2, 3]]))
                await asyncio.to_thread(backend.wait_calls, 1)  # `busy` is inside the model
                # Queued behind the stuck model; its deadline passes before the model is free.
                with pytest.raises(grpc.RpcError) as late:
                    await client.encode([[77, 78, 79]], timeout=0.2)
                backend.gate.set()
                await busy
                return late.value.code()

        assert asyncio.run(scenario()) == grpc.StatusCode.DEADLINE_EXCEEDED
        # The late sequence never reached the model.
        assert not any((ids == 77).any() for _, ids in backend.calls)
        assert server.running.engine.depth == 0
    finally:
        server.stop()
