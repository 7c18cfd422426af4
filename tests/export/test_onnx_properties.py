"""docs/model.md's properties of the encoder, checked on the exported graph in ONNX Runtime."""

import numpy as np
import pytest

from tests.conftest import SMALL_CONFIG


def ids(batch, seq_len, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, SMALL_CONFIG.vocab_size, size=(batch, seq_len), dtype=np.int64)


def test_rows_sum_to_one_and_exact_zeros_above_the_diagonal(small_runtime):
    _, attentions = small_runtime.run(ids(2, 64))
    np.testing.assert_allclose(attentions.sum(-1), 1.0, atol=1e-5)
    above = np.triu(np.ones((64, 64), dtype=bool), k=1)
    assert (attentions[..., above] == 0).all()


@pytest.mark.parametrize("t", [0, 9, 40])
def test_future_tokens_change_nothing_before_them(small_runtime, t):
    a = ids(1, 48)
    b = a.copy()
    b[:, t + 1 :] = (b[:, t + 1 :] + 11) % SMALL_CONFIG.vocab_size
    emb_a, att_a = small_runtime.run(a)
    emb_b, att_b = small_runtime.run(b)
    np.testing.assert_allclose(emb_a[:, : t + 1], emb_b[:, : t + 1], atol=1e-6, rtol=0)
    np.testing.assert_allclose(att_a[..., : t + 1, :], att_b[..., : t + 1, :], atol=1e-6, rtol=0)
    assert not np.allclose(emb_a[:, t + 1 :], emb_b[:, t + 1 :])


def test_right_padding_is_exact_in_a_mixed_batch(small_runtime):
    lengths = [1, 17, 256, 5]
    seqs = [ids(1, n, seed=n) for n in lengths]
    batch = np.full((len(lengths), max(lengths)), SMALL_CONFIG.pad_id, dtype=np.int64)
    for row, seq in enumerate(seqs):
        batch[row, : seq.shape[1]] = seq[0]
    emb_b, att_b = small_runtime.run(batch)
    fused_b = small_runtime.embed(batch)
    for row, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
        emb, att = small_runtime.run(seq)
        np.testing.assert_allclose(emb_b[row, :n], emb[0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(att_b[row, ..., :n, :n], att[0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(fused_b[row, :n], small_runtime.embed(seq)[0], atol=1e-5, rtol=0)
        np.testing.assert_allclose(fused_b[row, :n], emb[0], atol=1e-5, rtol=0)
