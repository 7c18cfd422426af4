"""Attention over the wire: float16 and causal-packed decode to the full weights, in the
dtype asked for."""

import numpy as np
import pytest

from attnserve.model.packing import packed_length


@pytest.mark.parametrize(
    ("dtype", "layout", "atol", "shrink"),
    [
        ("float32", "full", 1e-6, 1),
        ("float32", "causal-packed", 1e-6, 2),
        ("float16", "full", 5e-4, 2),
        ("float16", "causal-packed", 5e-4, 4),
    ],
)
def test_every_encoding_decodes_to_the_full_weights(
    client, small_runtime, dtype, layout, atol, shrink
):
    ids = list(range(1, 120))
    _, attentions = small_runtime.run(np.array([ids]))
    full = client.encode([ids], attention=True)
    out = client.encode([ids], attention=True, attention_dtype=dtype, attention_layout=layout)
    attention = out[0].attention
    assert attention.dtype == np.dtype(dtype) and attention.shape == (2, 4, 119, 119)
    np.testing.assert_allclose(attention, attentions[0], atol=atol, rtol=0)
    assert (attention[..., np.triu_indices(119, 1)[0], np.triu_indices(119, 1)[1]] == 0).all()
    # What went over the wire shrank as promised (embeddings are the same in both).
    embedding_bytes = 119 * 64 * 4
    full_bytes = full.wire_bytes - embedding_bytes
    assert out.wire_bytes - embedding_bytes == pytest.approx(full_bytes / shrink, rel=0.02)


def test_all_layers_and_heads_at_max_seq_len(client, small_runtime):
    ids = np.random.default_rng(0).integers(0, 259, size=300).tolist()
    _, attentions = small_runtime.run(np.array([ids]))
    options = {"attention": True, "attention_dtype": "float16", "attention_layout": "causal-packed"}
    out = client.encode([ids], **options)
    assert out[0].attention.shape == (2, 4, 300, 300)
    np.testing.assert_allclose(out[0].attention, attentions[0], atol=5e-4, rtol=0)
    assert out.wire_bytes > 2 * 4 * packed_length(300) * 2  # every head really was sent
    kept = client.encode([ids], unpack_attention=False, **options)[0]
    assert kept.attention.shape == (2, 4, packed_length(300))
    np.testing.assert_array_equal(kept.unpacked_attention(), out[0].attention)
