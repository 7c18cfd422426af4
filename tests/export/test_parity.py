"""ONNX Runtime agrees with PyTorch on the default model at every length that matters."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from attnserve.export import DEFAULT_TOLERANCE, FP16_TOLERANCE
from attnserve.export.model_dir import write_model_dir
from attnserve.export.parity import (
    LONGEST_CASE_BYTES,
    LONGEST_CASE_PARAMETER_TOKENS,
    ParityError,
    check_parity,
    default_shapes,
    scaled_diff,
)
from attnserve.model.artifacts import ONNX_FILENAME, RESIDUAL_STREAM_NAME
from attnserve.model.encoder import Encoder, build_encoder
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
    with pytest.raises(ParityError, match=r"\(model\.onnx\).* batch=1, seq_len=1: embeddings"):
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


# GPT-2's switches, deep and wide enough that float32's rounding of a stream in the
# thousands passes 1e-4 (two layers of 64 stay below it); and Llama's: RMSNorm, rotary
# positions, grouped-query attention, a gated MLP, no biases, an unembedding of its own.
DEEPER_GPT2 = replace(SMALL_CONFIG, n_layers=4, d_model=128, d_ff=512, max_seq_len=64)
SMALL_LLAMA = replace(
    DEEPER_GPT2,
    norm="rmsnorm",
    positions="rotary",
    n_kv_heads=2,
    mlp="gated",
    activation="silu",
    bias=False,
    unembedding="separate",
)
OUTLIER = 3000.0  # GPT-2's first token reaches about this in a few dimensions


def trained_scale(model: Encoder, std: float = 0.2, outlier: float = OUTLIER) -> Encoder:
    """Weights as large as a trained model's activations make them: every matrix and table
    drawn at `std` (10x GPT-2's initialisation), and one residual dimension of `outlier` on
    the first position (learned positions, as GPT-2's) or on a quarter of the vocabulary."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.ndim == 2:
                weight.copy_(torch.randn(weight.shape, generator=generator) * std)
        if model.config.positions == "learned":
            model.pos_emb.weight[0, 3] = outlier
        else:
            model.tok_emb.weight[: model.config.vocab_size // 4, 3] = outlier
    return model


@pytest.mark.parametrize(
    ("config", "precisions"),
    [(DEEPER_GPT2, ("fp32", "fp16")), (SMALL_LLAMA, ("fp32",))],
    ids=["gpt2", "llama"],
)
def test_trained_scale_checkpoints_pass_every_graph(config, precisions, tmp_path):
    """Every graph an export writes passes its gate on activations in the thousands, where
    an absolute 1e-4 on the residual stream is below float32's own rounding.

    The lower precisions' gates judge attention absolutely (bounded) and, for int8, the
    embeddings by their cosine: scale-free already. On these weights int8 (int8 inputs,
    accuracy level 4) misses its attention gate on both shapes (0.053 > 0.05) and float16 on
    Llama's (0.013 > 0.01): what they cost on such activations, not what the gate gets wrong.
    """
    model = trained_scale(build_encoder(config, seed=3))
    with torch.inference_mode():
        stream, _ = model.residual_stream(torch.zeros(1, 4, dtype=torch.long))
    assert stream[-1].abs().max() > OUTLIER / 2  # the outlier survives to the last layer
    report = write_model_dir(model, tmp_path / "model", log=lambda _: None, precisions=precisions)
    graphs = {case.graph for case in report.parity}
    assert {"model.onnx", "model_embeddings.onnx", "model_readouts.onnx"} <= graphs
    assert {"model_lens.onnx", "model_attribution.onnx"} <= graphs
    assert ("model_fp16.onnx" in graphs) == ("fp16" in precisions)
    # The old absolute gate would have refused it: the stream's rounding passes 1e-4.
    readouts = [c for c in report.parity if c.graph == "model_readouts.onnx"]
    assert max(c.max_abs_diff[RESIDUAL_STREAM_NAME] for c in readouts) > DEFAULT_TOLERANCE
    if "fp16" in precisions:  # its readouts: what float16 costs them, recorded, not gated
        recorded = report.output_fidelity["model_readouts_fp16.onnx"]
        assert recorded["embeddings"] <= FP16_TOLERANCE
        assert {RESIDUAL_STREAM_NAME, "head_outputs", "mlp_outputs"} <= set(recorded)


def test_trained_scale_parity_still_catches_a_different_model(tmp_path):
    model = trained_scale(build_encoder(SMALL_LLAMA, seed=3))
    write_model_dir(model, tmp_path / "model", log=lambda _: None)
    other = trained_scale(build_encoder(SMALL_LLAMA, seed=3), std=0.201)  # 0.5% larger weights
    with pytest.raises(ParityError, match=r"embeddings [\d.e-]+ of its scale \(max abs diff"):
        check_parity(other, tmp_path / "model" / ONNX_FILENAME)


def test_scaled_diff_judges_rows_by_their_own_scale():
    want = np.array([[3000.0, 1.0, 0.5], [0.2, 0.1, 0.3]], dtype=np.float32)
    # 0.03 off on the outlier's row: 1e-5 of its scale
    got = want + np.array([[0.03, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    assert scaled_diff(got, want, bounded=False) == pytest.approx(1e-5, rel=1e-3)
    # the same 0.03 in the small row is judged absolutely: the outlier loosens no other row
    got = want + np.array([[0.0, 0.0, 0.0], [0.03, 0.0, 0.0]], dtype=np.float32)
    assert scaled_diff(got, want, bounded=False) == pytest.approx(0.03, rel=1e-3)
    # bounded values (probabilities) are absolute whatever their row
    assert scaled_diff(want + 0.03, want, bounded=True) == pytest.approx(0.03, rel=1e-3)
    nan = want.copy()
    nan[1, 1] = np.nan
    assert np.isnan(scaled_diff(nan, want, bounded=False))
