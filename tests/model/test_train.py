"""Training (`attnserve train`), on a few steps of a small model: files, determinism, format."""

from __future__ import annotations

import json
import math

import pytest
import torch

from attnserve.model.checkpoint import load_checkpoint
from attnserve.model.config import ModelConfig
from attnserve.model.train import Corpus, TrainConfig, learning_rate, train, window_length

TINY = ModelConfig(n_layers=1, n_heads=2, d_model=32, d_ff=64, max_seq_len=64)
FEW = TrainConfig(
    steps=4,
    tokens_per_step=32,
    short_seq_len=8,
    seq_len=16,
    long_every=2,
    eval_every=2,
    eval_tokens=64,
    warmup_steps=2,
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "tiny.safetensors"
    return out, train(out, FEW, TINY)


def test_training_writes_a_float16_checkpoint_a_report_and_a_curve(trained):
    out, report = trained
    from safetensors import safe_open

    with safe_open(str(out), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}  # noqa: SIM118
        assert "lm_head" not in " ".join(f.keys())  # the head is tied: nothing extra is served
    model = load_checkpoint(out)  # widened back to float32
    assert model.config == TINY and next(model.parameters()).dtype == torch.float32
    assert json.loads(out.with_name(out.name + ".report.json").read_text()) == report
    assert out.with_name(out.name + ".loss.png").read_bytes()[:4] == b"\x89PNG"
    assert report["steps"] == FEW.steps
    assert report["tokens_seen"] == FEW.steps * FEW.tokens_per_step
    assert [(p["step"], p["seq_len"]) for p in report["curve"]] == [(0, 8), (2, 8), (4, 16)]
    assert report["validation_bits_per_byte"] == round(
        report["curve"][-1]["validation_loss"] / math.log(2), 4
    )


def test_training_is_deterministic_from_its_seed(trained, tmp_path):
    out, report = trained
    again = train(tmp_path / "again.safetensors", FEW, TINY)
    assert (tmp_path / "again.safetensors").read_bytes() == out.read_bytes()
    assert again["curve"] == report["curve"]


def test_the_corpus_is_split_and_its_unigram_entropy_is_a_real_baseline():
    corpus = Corpus.load(ModelConfig())
    assert corpus.bytes > 400_000 and len(corpus.validation) > 30_000
    assert len(corpus.train) > 8 * len(corpus.validation)
    # Bytes of English text carry ~4-5 bits each by frequency alone (8 would be uniform).
    assert 3.5 < corpus.unigram_bits_per_byte() < 6


def test_every_fourth_window_is_longer_cycling_through_the_doublings():
    c = TrainConfig(steps=100, short_seq_len=64, seq_len=1024, long_every=4)
    lengths = [window_length(step, c) for step in range(32)]
    assert lengths[:8] == [64, 64, 64, 128, 64, 64, 64, 256]
    assert lengths[3::4] == [128, 256, 512, 1024] * 2  # every position trains all along
    assert lengths.count(64) == 24
    assert {window_length(s, TrainConfig(long_every=0)) for s in range(8)} == {64}


def test_the_schedule_warms_up_then_decays_to_its_floor():
    c = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr=1e-4)
    assert learning_rate(0, c) == pytest.approx(1e-4)
    assert learning_rate(9, c) == pytest.approx(1e-3)
    assert learning_rate(55, c) == pytest.approx(5.5e-4)
    assert learning_rate(100, c) == pytest.approx(1e-4)
