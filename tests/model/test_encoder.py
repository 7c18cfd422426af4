"""The properties docs/model.md lists for the encoder, checked on the PyTorch model."""

import pytest
import torch
import torch.nn.functional as F

from attnserve.model.config import ModelConfig
from attnserve.model.encoder import build_encoder
from tests.conftest import SMALL_CONFIG


def run(model, ids):
    with torch.inference_mode():
        return model(torch.as_tensor(ids, dtype=torch.int64))


def random_ids(batch, seq_len, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, SMALL_CONFIG.vocab_size, (batch, seq_len), generator=g)


def test_output_shapes(small_model):
    embeddings, attentions = run(small_model, random_ids(3, 17))
    c = SMALL_CONFIG
    assert embeddings.shape == (3, 17, c.d_model)
    assert attentions.shape == (3, c.n_layers, c.n_heads, 17, 17)


def test_attention_rows_sum_to_one_and_are_exactly_zero_above_the_diagonal(small_model):
    _, attentions = run(small_model, random_ids(2, 40))
    torch.testing.assert_close(attentions.sum(-1), torch.ones(2, 2, 4, 40), atol=1e-5, rtol=0)
    above = torch.ones(40, 40, dtype=torch.bool).triu(1)
    assert (attentions[..., above] == 0).all()
    assert (attentions[..., ~above] > 0).all()  # softmax of finite scores is never 0


@pytest.mark.parametrize("t", [0, 5, 30])
def test_future_tokens_change_nothing_before_them(small_model, t):
    ids = random_ids(1, 32)
    changed = ids.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % SMALL_CONFIG.vocab_size
    emb_a, att_a = run(small_model, ids)
    emb_b, att_b = run(small_model, changed)
    torch.testing.assert_close(emb_a[:, : t + 1], emb_b[:, : t + 1], atol=1e-6, rtol=0)
    torch.testing.assert_close(att_a[..., : t + 1, :], att_b[..., : t + 1, :], atol=1e-6, rtol=0)
    if t < 31:  # and the change is really seen after t
        assert not torch.allclose(emb_a[:, t + 1 :], emb_b[:, t + 1 :])


def test_right_padding_is_exact(small_model):
    ids = random_ids(1, 11)
    padded = torch.cat([ids, torch.full((1, 21), SMALL_CONFIG.pad_id)], dim=1)
    emb, att = run(small_model, ids)
    emb_p, att_p = run(small_model, padded)
    torch.testing.assert_close(emb_p[:, :11], emb, atol=1e-5, rtol=0)
    torch.testing.assert_close(att_p[..., :11, :11], att, atol=1e-5, rtol=0)
    assert (att_p[..., :11, 11:] == 0).all()  # real tokens never look at the padding


def test_mixed_lengths_in_one_right_padded_batch_equal_each_alone(small_model):
    lengths = [3, 19, 8]
    seqs = [random_ids(1, n, seed=n) for n in lengths]
    batch = torch.full((3, max(lengths)), SMALL_CONFIG.pad_id)
    for row, seq in enumerate(seqs):
        batch[row, : seq.shape[1]] = seq[0]
    emb_b, att_b = run(small_model, batch)
    for row, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
        emb, att = run(small_model, seq)
        torch.testing.assert_close(emb_b[row, :n], emb[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(att_b[row, ..., :n, :n], att[0], atol=1e-5, rtol=0)


def test_longer_than_max_seq_len_is_refused(small_model):
    with pytest.raises(ValueError, match="exceeds max_seq_len 300"):
        run(small_model, random_ids(1, 301))


def test_same_seed_same_weights_and_global_rng_untouched():
    config = ModelConfig(n_layers=1, n_heads=2, d_model=16, d_ff=32, max_seq_len=8)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = build_encoder(config, seed=5), build_encoder(config, seed=5)
    assert torch.rand(1) == before  # building a model does not consume the caller's RNG
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    c = build_encoder(config, seed=6)
    assert not torch.equal(a.tok_emb.weight, c.tok_emb.weight)


def test_decode_steps_equal_the_full_forward_for_a_padded_batch():
    """Two texts, the second's prompt one token shorter (its cache padded in front), decoded
    a token at a time together: each step's logits are the full forward's at that position,
    for learned and rotary positions, grouped heads and a sliding window."""
    for config in (
        ModelConfig(n_layers=2, n_heads=4, d_model=32, d_ff=64, max_seq_len=32),
        ModelConfig(
            n_layers=2, n_heads=4, n_kv_heads=2, d_model=32, d_ff=64, max_seq_len=32,
            positions="rotary", norm="rmsnorm", sliding_window=3,
        ),
    ):  # fmt: skip
        model = build_encoder(config)
        texts = torch.randint(0, config.vocab_size, (2, 9))
        empty = (torch.zeros(1, config.kv_heads, 0, config.head_dim),) * 2
        no_past = torch.zeros(1, 0, dtype=torch.long)
        with torch.no_grad():
            want = model.logits(texts)  # (2, 9, V)
            caches = []
            for row, length in ((0, 4), (1, 3)):
                logits, past = model.decode(texts[row : row + 1, :length], no_past, [empty] * 2)
                assert torch.allclose(logits[0], want[row, length - 1], atol=1e-5)
                caches.append(past)
            past = [
                (torch.cat((k0, F.pad(k1, (0, 0, 1, 0)))), torch.cat((v0, F.pad(v1, (0, 0, 1, 0)))))
                for (k0, v0), (k1, v1) in zip(*caches, strict=True)
            ]
            mask = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
            for step in range(4, 9):  # text 0 at position `step`, text 1 one behind
                ids = torch.stack([texts[0, step], texts[1, step - 1]])[:, None]
                logits, past = model.decode(ids, mask, past)
                mask = torch.cat((mask, torch.ones(2, 1, dtype=torch.long)), 1)
                assert torch.allclose(logits[0], want[0, step], atol=1e-5)
                assert torch.allclose(logits[1], want[1, step - 1], atol=1e-5)
