"""ONNX Runtime agrees with PyTorch on the default model at every length that matters."""

import numpy as np
import pytest
import torch

from attnserve.export.parity import ParityError, check_parity
from attnserve.model.artifacts import ONNX_FILENAME
from attnserve.model.encoder import build_encoder
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
