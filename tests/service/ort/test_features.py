"""Sparse-autoencoder features as served (the readouts graph's run, then each SAE's graph)
against SAELens' own `SAE.encode` on transformers' residual stream, attention output and the
sites the MLP's norm computes, for three families: the activations, the strongest features,
L0 and the reconstruction error's norm."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnserve.export.sae import add_sae
from attnserve.model.tokenizer import ByteTokenizer
from attnserve.service.core.backend import ReadoutSelection
from attnserve.service.core.errors import UnsupportedError
from attnserve.service.core.features import plan_features
from attnserve.service.core.request import FeaturesOptions
from attnserve.service.core.view import InputContext, ModelView
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from tests.conftest import linked_copy
from tests.export.test_hf_families import padded_batch
from tests.export.test_hf_readouts import blocks
from tests.export.test_sae import saelens_sae

TOLERANCE = 1e-4  # of each position's largest activation (issue 69)


# Each family's decoder-layer modules whose output is what attention writes (after its
# output norm: hook_attn_out), whose input is the stream between attention and MLP
# (hook_resid_mid) and whose output the MLP reads (mlp.hook_in), and whose output is what
# the MLP writes (hook_mlp_out).
ATTENTION_SITES = {
    "llama": ("self_attn", "post_attention_layernorm", "mlp"),
    "gemma2": (
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    ),
    "gpt2": ("attn", "ln_2", "mlp"),
}


def standardized(norm, x: torch.Tensor) -> torch.Tensor:
    """TransformerLens' hook_normalized of a transformers norm: x / sqrt(mean x^2 + eps), or
    (a LayerNorm) x centred over sqrt(var + eps)."""
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    if isinstance(norm, torch.nn.LayerNorm):
        x = x - x.mean(-1, keepdim=True)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def view_of(runtime: OrtRuntime) -> ModelView:
    """The runtime as the data plane's planners see it."""
    return ModelView(runtime.config, ByteTokenizer(runtime.config), runtime.graphs, runtime.saes)


def residual_sites(reference, family: str, ids: np.ndarray) -> dict[str, np.ndarray]:
    """transformers' sites (B, T, D) by TransformerLens' names: what each decoder layer
    reads (hook_resid_pre) and writes (hook_resid_post; the last before the final norm),
    what its attention writes (hook_attn_out), the stream between (hook_resid_mid), the
    norm of it the MLP reads (ln2.hook_normalized, mlp.hook_in) and what its MLP writes
    (hook_mlp_out)."""
    values, handles = {}, []

    def keep(name: str, x) -> None:
        x = x[0] if isinstance(x, tuple) else x
        values[name] = x.numpy().copy()

    attention, between, mlp = ATTENTION_SITES[family]
    for layer, block in enumerate(blocks(reference)):

        def read(_module, args, kwargs, name=f"blocks.{layer}.hook_resid_pre"):
            keep(name, args[0] if args else kwargs["hidden_states"])

        def write(_module, _args, output, name=f"blocks.{layer}.hook_resid_post"):
            keep(name, output)

        def attn_out(_module, _args, output, name=f"blocks.{layer}.hook_attn_out"):
            keep(name, output)

        def mid(norm, args, output, layer=layer):
            keep(f"blocks.{layer}.hook_resid_mid", args[0])
            keep(f"blocks.{layer}.ln2.hook_normalized", standardized(norm, args[0]))
            keep(f"blocks.{layer}.mlp.hook_in", output)  # what the MLP reads

        def mlp_out(_module, _args, output, name=f"blocks.{layer}.hook_mlp_out"):
            keep(name, output)

        handles.append(block.register_forward_pre_hook(read, with_kwargs=True))
        handles.append(block.register_forward_hook(write))
        handles.append(getattr(block, attention).register_forward_hook(attn_out))
        handles.append(getattr(block, between).register_forward_hook(mid))
        handles.append(getattr(block, mlp).register_forward_hook(mlp_out))
    try:
        with torch.no_grad():
            reference(torch.as_tensor(ids))
    finally:
        for handle in handles:
            handle.remove()
    return values


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_served_features_equal_saelens_on_transformers_residual(families, tmp_path, family):
    _, reference = families.checkpoint(family)
    model_dir = linked_copy(families.exported(family), tmp_path / "model")
    d, last = reference.config.hidden_size, reference.config.num_hidden_layers - 1
    hooks = {  # name: (architecture, site); the last block's output before the final norm
        "standard": ("standard", f"blocks.{last}.hook_resid_post"),
        "jumprelu": ("jumprelu", "blocks.0.hook_resid_post"),
        "topk": ("topk", f"blocks.{last}.hook_resid_pre"),
        "attn_out": ("standard", "blocks.0.hook_attn_out"),
        "resid_mid": ("jumprelu", f"blocks.{last}.hook_resid_mid"),
        # sites the model's norms compute from hook_resid_mid (export/sae_site.py)
        "ln2_normalized": ("topk", "blocks.0.ln2.hook_normalized"),
        "mlp_in": ("jumprelu", f"blocks.{last}.mlp.hook_in"),
    }
    saes = {}
    for name, (architecture, hook) in hooks.items():
        (tmp_path / name).mkdir()
        sae, source = saelens_sae(tmp_path / name, architecture, d_in=d, hook=hook, threshold=0.2)
        add_sae(model_dir, source, name=name, log=lambda _: None)
        saes[name] = sae
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    assert set(runtime.saes) == set(hooks)

    ids, lengths = padded_batch(reference.config.vocab_size, seed=3)
    options = FeaturesOptions(saes=tuple(hooks), top_k=12, dense=True, feature_ids=(5, 0, 7))
    selections = [
        ReadoutSelection(features=plan_features(options, InputContext(view_of(runtime), t, row)))
        for row, t in enumerate(lengths)
    ]
    _, outputs = runtime.read(ids, list(lengths), selections)
    sites = residual_sites(reference, family, ids)
    switched_off = 0
    for row, (t, out) in enumerate(zip(lengths, outputs, strict=True)):
        got = out.features
        assert got is not None and got.activations is not None
        n = len(hooks)
        assert got.top_ids.shape == (n, t, 12) and got.l0.shape == got.error_norm.shape == (n, t)
        for i, (name, sae) in enumerate(saes.items()):
            architecture, hook = hooks[name]
            x = torch.from_numpy(sites[hook][row, :t])  # (t, D)
            with torch.no_grad():
                _, cache = sae.run_with_cache(x[None])
                want = sae.encode(x[None])[0].numpy()  # (t, S)
                pre = cache["hook_sae_acts_pre"][0].numpy()
                error = (x - sae.decode(torch.from_numpy(want))).norm(dim=-1).numpy()
            largest = np.maximum(np.abs(want).max(-1), 1e-6)  # (t,)
            # a feature a rounding away from switching may switch either way
            near = np.zeros_like(want, dtype=bool)
            if architecture == "jumprelu":
                near = np.abs(pre - sae.threshold.detach().numpy()) <= TOLERANCE * largest[:, None]
                switched_off += int(((pre > 0) & (want == 0)).sum())
            if architecture == "topk":
                ranked = -np.sort(-pre, axis=-1)
                gap = ranked[:, sae.cfg.k - 1] - ranked[:, sae.cfg.k]
                near |= (gap <= TOLERANCE * largest)[:, None]
            clear = ~near.any(-1)  # (t,)
            assert clear.mean() > 0.5  # the comparison below covers most positions
            diff = np.where(near, 0, np.abs(got.activations[i] - want)).max(-1)
            assert (diff <= TOLERANCE * largest).all()
            np.testing.assert_array_equal(got.l0[i][clear], (want > 0).sum(-1)[clear])
            order = np.argsort(-want, axis=-1, kind="stable")[:, :12]
            strongest = np.take_along_axis(want, order, -1)
            active = strongest > 0
            expected_ids = np.where(active, order, -1)
            np.testing.assert_array_equal(got.top_ids[i][clear], expected_ids[clear])
            assert (
                np.abs(got.top_activations[i] - np.where(active, strongest, 0)).max(-1)[clear]
                <= TOLERANCE * largest[clear]
            ).all()
            scale = np.linalg.norm(x.numpy(), axis=-1)
            assert (np.abs(got.error_norm[i] - error)[clear] <= TOLERANCE * scale[clear]).all()
            np.testing.assert_array_equal(
                got.feature_activations[i], got.activations[i][:, [5, 0, 7]]
            )
    assert switched_off > 0  # the thresholds turned features off that a ReLU keeps


def test_a_batch_of_different_selections_reads_as_each_row_alone(small_model_dir, tmp_path):
    """Rows asking different SAEs, positions, k and outputs (as the batcher joins requests)
    get what each asks, as when read alone: each SAE runs once on every asking row."""
    model_dir = linked_copy(small_model_dir, tmp_path / "model")
    for name, (architecture, hook) in {
        "resid": ("jumprelu", "blocks.1.hook_resid_post"),
        "attn": ("standard", "blocks.0.hook_attn_out"),
    }.items():
        (tmp_path / name).mkdir()
        _, source = saelens_sae(tmp_path / name, architecture, hook=hook, threshold=2.0)
        add_sae(model_dir, source, name=name, log=lambda _: None)
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    assert runtime.sae_graphs is not None  # each SAE's decoder left unread when not asked
    assert runtime.sae_graphs.decoder_on_demand == {"resid", "attn"}
    options = [
        FeaturesOptions(saes=("resid", "attn"), top_k=3, feature_ids=(1, 4)),
        None,
        FeaturesOptions(saes=("attn",), positions=(0, -1), top_k=7, skip_error_norm=True),
        FeaturesOptions(saes=("resid",), dense=True),
    ]
    rng = np.random.default_rng(5)
    ids = rng.integers(0, runtime.config.vocab_size, size=(4, 9))
    lengths = [9, 9, 6, 9]

    def selection(row: int) -> ReadoutSelection:
        o = options[row]
        if o is None:
            return ReadoutSelection()
        return ReadoutSelection(
            features=plan_features(o, InputContext(view_of(runtime), lengths[row], row))
        )

    _, together = runtime.read(ids, lengths, [selection(row) for row in range(4)])
    for row in range(4):
        _, (alone,) = runtime.read(ids[row : row + 1], [lengths[row]], [selection(row)])
        got, want = together[row].features, alone.features
        if options[row] is None:
            assert got is None
            continue
        assert got is not None and want is not None
        for name in ("top_ids", "l0"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
        for name in ("top_activations", "error_norm", "feature_activations", "activations"):
            a, b = getattr(got, name), getattr(want, name)
            assert (a is None) == (b is None), name
            if a is not None:
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert together[2].features.top_ids.shape == (1, 2, 7)
    assert together[2].features.error_norm is None


def test_a_features_direction_is_its_decoder_row_read_from_float32_weights(
    small_model_dir, tmp_path
):
    """The row where the SAE's float32 weights lie on disk; an SAE added in 8 bits (its rows
    packed by MatMulNBits) refuses, saying how to steer by it instead."""
    model_dir = linked_copy(small_model_dir, tmp_path / "model")
    sae, source = saelens_sae(tmp_path / "sae", "jumprelu")
    add_sae(model_dir, source, name="float32", log=lambda _: None)
    add_sae(model_dir, source, name="eight", precision="int8", log=lambda _: None)
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    for feature in (0, 5, sae.cfg.d_sae - 1):
        np.testing.assert_array_equal(
            runtime.feature_direction("float32", feature), sae.W_dec[feature].detach().numpy()
        )
    with pytest.raises(UnsupportedError, match=r"'eight' was added in 8 bits: .*send the row"):
        runtime.feature_direction("eight", 0)
