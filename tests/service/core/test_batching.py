"""Dynamic batching is exact: a sequence gets the same numbers alone or in any batch."""

import asyncio

import numpy as np

from attnserve.client import AsyncEncoderClient, ClientOptions


def test_200_concurrent_mixed_lengths_equal_each_alone(server, small_runtime):
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 301, size=200)
    lengths[:2] = (1, 300)  # both extremes
    sequences = [rng.integers(0, 259, size=n).tolist() for n in lengths]
    batches_before = server.metric("attnserve_batch_size_count")

    async def fire():
        async with AsyncEncoderClient(server.address, ClientOptions(timeout_s=300)) as c:
            calls = [c.encode([ids], attention=(i % 4 == 0)) for i, ids in enumerate(sequences)]
            return await asyncio.gather(*calls)

    outputs = asyncio.run(fire())
    for i, (ids, out) in enumerate(zip(sequences, outputs, strict=True)):
        alone = np.array([ids], dtype=np.int64)
        if i % 4 == 0:
            embeddings, attentions = small_runtime.run(alone)
            np.testing.assert_allclose(out[0].attention, attentions[0], atol=1e-5, rtol=0)
        else:
            embeddings = small_runtime.embed(alone)
        np.testing.assert_allclose(out[0].embeddings, embeddings[0], atol=1e-5, rtol=0)
    batches = server.metric("attnserve_batch_size_count") - batches_before
    assert batches < 200  # they really were batched together
