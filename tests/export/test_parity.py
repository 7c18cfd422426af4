"""ONNX Runtime agrees with PyTorch on the default model at every length that matters."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from attnserve.export.parity import (
    LONGEST_CASE_BYTES,
    LONGEST_CASE_PARAMETER_TOKENS,
    ParityError,
    check_parity,
    default_shapes,
)
from attnserve.model.artifacts import ONNX_FILENAME
from attnserve.model.encoder import build_encoder
from attnserve.model.footprint import parameter_count
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from tests.conftest import SMALL_CONFIG


@pytest.fixture(scope="module")
def default_runtime(default_export):
    return OrtRuntime(default_export[0], RuntimeOptions(provider="cpu"))


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("seq_len", [1, 2, 17, 256, 1024])
def test_ort_matches_pytorch(default_runtime, default_model, batch, seq_len):
    ids = np.random.default_rng(seq_len).integers(0, 259, size=(batch, seq_len), dtype=np.int64)
    embeddings, attentions = default_runtime.run(ids)
    with torch.inference_mode():
        want_emb, want_att = default_model(torch.from_numpy(ids))
    assert np.abs(embeddings - want_emb.numpy()).max() <= 1e-4
    assert np.abs(attentions - want_att.numpy()).max() <= 1e-4
    # The embeddings-only graph (fused Attention op) agrees too.
    assert np.abs(default_runtime.embed(ids) - want_emb.numpy()).max() <= 1e-4


def test_parity_check_catches_a_different_model(small_model_dir):
    other = build_encoder(SMALL_CONFIG, seed=99)  # same shapes, other weights
    with pytest.raises(ParityError, match=r"\(model\.onnx\).* batch=1, seq_len=1: max abs diff"):
        check_parity(other, small_model_dir / ONNX_FILENAME)


def test_default_shapes_bound_the_longest_case_by_memory_and_compute():
    # A small model checks its whole context.
    assert max(t for _, t in default_shapes(SMALL_CONFIG)) == SMALL_CONFIG.max_seq_len
    # TinyLlama-1.1B's shape: the forward pass bounds it, not the attention weights.
    tinyllama = replace(
        SMALL_CONFIG,
        d_model=2048,
        n_heads=32,
        n_kv_heads=4,
        d_ff=5632,
        n_layers=22,
        vocab_size=32000,
        max_seq_len=2048,
    )
    longest = max(t for _, t in default_shapes(tinyllama))
    assert 17 < longest < tinyllama.max_seq_len
    assert longest * parameter_count(tinyllama) <= LONGEST_CASE_PARAMETER_TOKENS
    assert (longest + 1) * parameter_count(tinyllama) > LONGEST_CASE_PARAMETER_TOKENS
    assert tinyllama.n_layers * tinyllama.n_heads * 4 * longest**2 <= LONGEST_CASE_BYTES
