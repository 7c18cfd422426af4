"""A head mask sent as an array is checked against the served model's shape before it is
sent: only its entries that are not 1 travel, so a transposed mask would remove other heads."""

import asyncio

import numpy as np
import pytest

from attnserve.client import AsyncEncoderClient
from tests.conftest import SMALL_CONFIG

LAYERS, HEADS = SMALL_CONFIG.n_layers, SMALL_CONFIG.n_heads  # 2 x 4


def test_a_transposed_mask_is_refused_naming_both_shapes(client):
    transposed = np.ones((HEADS, LAYERS))
    transposed[3, 1] = 0.0
    with pytest.raises(ValueError, match=r"head_mask has shape \(4, 2\); model 'attnserve-encoder"
                       r"' has \(n_layers, n_heads\) = \(2, 4\)"):  # fmt: skip
        client.encode("abc", head_mask=transposed)
    with pytest.raises(ValueError, match=r"shape \(4, 2\)"):
        client.encode_layers("abc", attention=True, head_mask=transposed)


def test_a_mask_of_the_models_shape_removes_the_heads_it_names(client):
    mask = np.ones((LAYERS, HEADS))
    mask[1, 3] = 0.0
    by_array = client.encode("abc", head_mask=mask)[0].embeddings
    by_mapping = client.encode("abc", head_mask={(1, 3): 0.0})[0].embeddings
    plain = client.encode("abc")[0].embeddings
    np.testing.assert_array_equal(by_array, by_mapping)
    assert not np.allclose(by_array, plain)


def test_the_async_client_checks_too(server):
    async def main():
        async with AsyncEncoderClient(server.address) as client:
            with pytest.raises(ValueError, match=r"shape \(3,\)"):
                await client.encode("abc", head_mask=[1.0, 0.0, 1.0])
            mask = np.ones((LAYERS, HEADS))
            mask[0, 0] = 0.0
            return (await client.encode("abc", head_mask=mask))[0].embeddings

    assert asyncio.run(main()).shape == (4, SMALL_CONFIG.d_model)
