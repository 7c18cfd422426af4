"""Every attention option through gRPC against numpy on the full float32 weights."""

from __future__ import annotations

import numpy as np
import pytest

from tests.service import attention_reference as ref

EXACT = 2e-5  # the bound for rows, reductions, top-k and entropy
ROLLOUT = 1e-4


@pytest.fixture(scope="module")
def inputs(small_runtime):
    """Two inputs of different lengths (they batch together, the short one padded) and the
    full float32 weights of each, computed alone."""
    rng = np.random.default_rng(7)
    sequences = [rng.integers(1, 259, size=n).tolist() for n in (37, 9)]
    weights = [small_runtime.run(np.array([ids]))[1][0] for ids in sequences]
    return sequences, weights


def test_query_positions_return_those_rows(client, inputs):
    sequences, weights = inputs
    out = client.encode(sequences, rows=[-1, 0, 4])
    for encoding, full in zip(out, weights, strict=True):
        t = full.shape[-1]
        assert encoding.rows == [t - 1, 0, 4]
        assert encoding.attention.shape == (2, 4, 3, t)
        np.testing.assert_allclose(encoding.attention, full[:, :, [t - 1, 0, 4]], atol=EXACT)


@pytest.mark.parametrize("reduction", ["mean", "max"])
def test_head_reduction_over_the_selected_heads(client, inputs, reduction):
    sequences, weights = inputs
    out = client.encode(sequences, layers=[1], heads=[3, 0, 2], head_reduction=reduction)
    for encoding, full in zip(out, weights, strict=True):
        t = full.shape[-1]
        assert encoding.heads == [3, 0, 2]
        assert encoding.attention.shape == (1, 1, t, t)
        want = ref.reduce_heads(ref.select(full, [1], [3, 0, 2], range(t)), reduction)
        np.testing.assert_allclose(encoding.attention, want, atol=EXACT)


@pytest.mark.parametrize("reduction", ["none", "max"])  # none: rollout averages the heads
def test_rollout_is_the_product_of_residual_attention(client, inputs, reduction):
    sequences, weights = inputs
    out = client.encode(sequences, rollout=True, layers=[1, 0], head_reduction=reduction)
    for encoding, full in zip(out, weights, strict=True):
        t = full.shape[-1]
        assert encoding.layers == [0, 1]  # ascending: the order the product takes them
        assert encoding.attention.shape == (1, 1, t, t)
        want = ref.rollout(
            full, [0, 1], range(4), range(t), "mean" if reduction == "none" else "max"
        )
        np.testing.assert_allclose(encoding.attention, want, atol=ROLLOUT)
        rollout = encoding.attention[0, 0]
        assert (rollout[np.triu_indices(t, 1)] == 0).all()  # still causal
        np.testing.assert_allclose(rollout.sum(axis=-1), 1.0, atol=ROLLOUT)


def test_rollout_of_the_last_row_and_packed(client, inputs):
    sequences, weights = inputs
    last = client.encode(sequences, rollout=True, rows=[-1])
    packed = client.encode(sequences, rollout=True, attention_layout="causal-packed")
    for a, b, full in zip(last, packed, weights, strict=True):
        t = full.shape[-1]
        want = ref.rollout(full, [0, 1], range(4), range(t))
        np.testing.assert_allclose(a.attention, want[:, :, [t - 1]], atol=ROLLOUT)
        np.testing.assert_allclose(b.attention, want, atol=ROLLOUT)  # unpacked by the client


@pytest.mark.parametrize("k", [1, 5, 12])
def test_top_k_keeps_the_largest_keys_and_pads_short_rows(client, inputs, k):
    sequences, weights = inputs
    out = client.encode(sequences, rows=[0, 3, -1], top_k=k)
    for encoding, full in zip(out, weights, strict=True):
        rows = encoding.rows
        values, indices = ref.top_k(full[:, :, rows], rows, k)
        assert encoding.attention.shape == encoding.indices.shape == (2, 4, 3, k)
        assert encoding.indices.dtype == np.int32
        np.testing.assert_allclose(encoding.attention, values, atol=EXACT)
        np.testing.assert_array_equal(encoding.indices, indices)
    # Row 0 sees one key and row 3 four: the rest is padding, index -1 and weight 0.
    first = out[0]
    assert (first.indices[..., 0, 1:] == -1).all() and (first.attention[..., 0, 1:] == 0).all()
    assert (first.indices[..., 1, 4:] == -1).all()
    if k > 9:  # the 9-token input has fewer than k keys even in its last row
        assert (out[1].indices[..., 2, 9:] == -1).all()


def test_top_k_of_a_rollout_in_float16(client, inputs):
    sequences, weights = inputs
    out = client.encode(sequences, rollout=True, rows=[-1], top_k=8, attention_dtype="float16")
    for encoding, full in zip(out, weights, strict=True):
        t = full.shape[-1]
        values, indices = ref.top_k(ref.rollout(full, [0, 1], range(4), [t - 1]), [t - 1], 8)
        np.testing.assert_allclose(encoding.attention, values, atol=5e-4)
        np.testing.assert_array_equal(encoding.indices, indices)


def test_head_entropy_alone_leaves_the_weights_out(client, inputs):
    sequences, weights = inputs
    out = client.encode(
        sequences, heads=[2, 1], rows=[-1, -2], head_entropy=True, omit_weights=True
    )
    for encoding, full in zip(out, weights, strict=True):
        t = full.shape[-1]
        assert encoding.attention is None
        assert encoding.head_entropy.shape == (2, 2)
        want = ref.head_entropy(full, [0, 1], [2, 1], [t - 1, t - 2])
        np.testing.assert_allclose(encoding.head_entropy, want, atol=EXACT)
    assert not out.response.results[0].HasField("attention")


def test_entropy_is_of_the_heads_before_reduction(client, inputs):
    sequences, weights = inputs
    out = client.encode(sequences, head_reduction="mean", head_entropy=True)
    for encoding, full in zip(out, weights, strict=True):
        t = full.shape[-1]
        assert encoding.attention.shape == (2, 1, t, t) and encoding.head_entropy.shape == (2, 4)
        want = ref.head_entropy(full, [0, 1], range(4), range(t))
        np.testing.assert_allclose(encoding.head_entropy, want, atol=EXACT)


def test_summaries_shrink_the_answer(client, inputs):
    sequences, _ = inputs
    full = client.encode(sequences[0], attention=True, token_embeddings=False)
    last_row = client.encode(sequences[0], rows=[-1], token_embeddings=False)
    entropy = client.encode(
        sequences[0], head_entropy=True, omit_weights=True, token_embeddings=False
    )
    t = len(sequences[0])
    assert last_row.wire_bytes < full.wire_bytes / (t / 2)
    assert entropy.wire_bytes < last_row.wire_bytes
