"""Overload and deadlines: refuse fast and queue nothing; never run work nobody waits for."""

import asyncio
import time

import grpc
import numpy as np
import pytest

from client import AsyncEncoderClient, ClientOptions
from tests.conftest import ServerThread


@pytest.fixture
def small_queue_server(default_export):
    # The default model: a 1024-token sequence takes ~90 ms here, so a burst
    # arrives far faster than the model drains it, on any machine we run on.
    running = ServerThread(default_export[0], max_queue=8)
    yield running
    running.stop()


def test_a_burst_larger_than_the_queue(small_queue_server):
    server = small_queue_server
    runtime = server.running.runtime
    rng = np.random.default_rng(3)
    sequences = [rng.integers(0, 259, size=1024).tolist() for _ in range(40)]

    async def one(client, ids):
        start = time.perf_counter()
        try:
            out = await client.encode([ids])
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details(), time.perf_counter() - start
        return out, None, time.perf_counter() - start

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
    # Refusals are fast: they never waited for the model, answers did.
    assert np.median([r[2] for r in refused]) < np.median([r[2] for _, r in answered])
    # Nothing of a refused request was queued: the model ran exactly the answered ones.
    assert server.metric("attnserve_sequences_total") == len(answered)
    for ids, (out, _, _) in answered:
        embeddings = runtime.embed(np.array([ids]))
        np.testing.assert_allclose(out[0].embeddings, embeddings[0], atol=1e-5)


def test_a_deadline_that_expires_in_the_queue_costs_no_model_work(small_model_dir, small_runtime):
    server = ServerThread(small_model_dir, small_runtime)
    try:
        busy = [[1] * 300] * 13  # one full batch (13 x 300 <= 4096 tokens) with attention

        async def scenario():
            options = ClientOptions(retries=0, timeout_s=120)
            async with AsyncEncoderClient(server.address, options) as client:
                # Keep the model busy with five batches...
                work = [asyncio.create_task(client.encode(busy, attention=True)) for _ in range(5)]
                while server.metric("attnserve_sequences_total") == 0:
                    await asyncio.sleep(0.001)  # ...until the first one is running,
                # ...then ask for something that must be done within 20 ms.
                with pytest.raises(grpc.aio.AioRpcError) as excinfo:
                    await client.encode([[5, 6, 7]], timeout=0.02)
                await asyncio.gather(*work)
                return excinfo.value.code()

        assert asyncio.run(scenario()) == grpc.StatusCode.DEADLINE_EXCEEDED
        # Only the five busy batches ran; the late sequence never reached ONNX Runtime.
        assert server.metric("attnserve_sequences_total") == 5 * 13
        assert server.metric("attnserve_batch_size_count") == 5
    finally:
        server.stop()


def test_the_batcher_drops_expired_work_with_deadline_exceeded(small_runtime):
    from service.batcher import Batcher, BatcherOptions
    from service.errors import DeadlineExceededError
    from service.metrics import Metrics

    async def scenario():
        metrics = Metrics()
        batcher = Batcher(small_runtime, BatcherOptions(), metrics)
        expired = time.monotonic() - 1  # already past when the batch forms
        late = batcher.submit([np.arange(5)], with_attention=False, deadline=expired)
        live = batcher.submit([np.arange(5)], with_attention=False, deadline=None)
        batcher.start()
        result = await live[0]
        with pytest.raises(DeadlineExceededError, match=r"deadline passed while .* queued"):
            await late[0]
        await batcher.stop()
        return metrics, result

    metrics, result = asyncio.run(scenario())
    assert result.embeddings.shape == (5, 64)
    assert metrics.registry.get_sample_value("attnserve_expired_in_queue_total") == 1
    assert metrics.registry.get_sample_value("attnserve_sequences_total") == 1
