"""The formats SAEs are published in, each added to a model directory and held to SAELens'
own reading of it: a gated SAE in SAELens' directory, Gemma Scope's params.npz and a
Llama Scope directory (SAELens' loaders run on the files written here)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from sae_lens import SAE
from sae_lens.loading import pretrained_sae_loaders
from safetensors.torch import save_file

from attnserve.export.sae import SAEError, add_sae
from attnserve.model.artifacts import SAE_ONNX, SAE_OUTPUTS
from tests.export.test_sae import D_SAE, LAST, D, residual_rows, saelens_sae


def served(out: Path, x: torch.Tensor) -> dict[str, np.ndarray]:
    """The SAE graph written at `out`, run by ONNX Runtime on x."""
    session = ort.InferenceSession(str(out / SAE_ONNX), providers=["CPUExecutionProvider"])
    outputs = session.run(
        None, {"x": x.numpy(), "top_k": np.array([8]), "with_error_norm": np.array(True)}
    )
    return dict(zip(SAE_OUTPUTS, outputs, strict=True))


def assert_equal_to(sae: SAE, got: dict[str, np.ndarray], x: torch.Tensor) -> None:
    """Activations within 1e-4 of each position's largest, L0 and the error norm equal."""
    with torch.no_grad():
        want = sae.encode(x)
        error = (x - sae.decode(want)).norm(dim=-1).numpy()
    want = want.numpy()
    largest = np.abs(want).max(-1, keepdims=True)
    assert (largest > 0).all() and (want == 0).any()  # features on and off
    assert (np.abs(got["activations"] - want) <= 1e-4 * largest).all()
    np.testing.assert_array_equal(got["l0"], (want > 0).sum(-1))
    np.testing.assert_allclose(got["error_norm"], error, rtol=1e-4)


def test_a_gated_sae_equals_saelens(model_dir, tmp_path):
    sae, source = saelens_sae(tmp_path, "gated")
    out = add_sae(model_dir, source, log=lambda _: None)
    x = residual_rows(1)
    assert_equal_to(sae, served(out, x), x)


def test_gemma_scope_params_npz_with_its_hook(model_dir, tmp_path):
    """A JumpReLU SAE that does not subtract b_dec from its input, as Gemma Scope's
    (SAELens' gemma_2 loader reads the same keys, w_* spelt W_*)."""
    sae, _ = saelens_sae(tmp_path, "jumprelu")
    sae.cfg.apply_b_dec_to_input = False
    folder = tmp_path / "layer_1" / "width_16k" / "average_l0_71"
    folder.mkdir(parents=True)
    arrays = {k: v.detach().numpy() for k, v in sae.state_dict().items()}
    arrays["w_enc"] = arrays.pop("W_enc")  # either spelling
    np.savez(folder / "params.npz", **arrays)
    with pytest.raises(SAEError, match="does not name its site; give --hook"):
        add_sae(model_dir, folder / "params.npz", log=lambda _: None)
    out = add_sae(model_dir, folder / "params.npz", hook=LAST, log=lambda _: None)
    assert out.name == "average_l0_71"  # the folder holding it names it
    x = residual_rows(2)
    assert_equal_to(sae, served(out, x), x)


def test_llama_scope_with_its_dataset_norm_folded_in(model_dir, tmp_path, monkeypatch):
    """A Llama Scope directory, read by SAELens' own loader (its downloads pointed at the
    files written here) and folded as from_pretrained folds it."""
    generator = torch.Generator().manual_seed(5)
    source = tmp_path / "Llama3_1-8B-Base-L1R-8x"
    (source / "checkpoints").mkdir(parents=True)
    average_norm, threshold = 400.0, 0.3
    hyperparams = {
        "d_model": D,
        "d_sae": D_SAE,
        "hook_point_in": LAST,
        "hook_point_out": LAST,
        "norm_activation": "dataset-wise",
        "dataset_average_activation_norm": {"in": average_norm, "out": average_norm},
        "jump_relu_threshold": threshold,
        "top_k": 50,
    }
    (source / "hyperparams.json").write_text(json.dumps(hyperparams))
    shapes = {
        "encoder.weight": (D_SAE, D),
        "encoder.bias": (D_SAE,),
        "decoder.weight": (D, D_SAE),
        "decoder.bias": (D,),
    }
    save_file(
        {k: 0.1 * torch.randn(s, generator=generator) for k, s in shapes.items()},
        source / "checkpoints" / "final.safetensors",
    )

    def local(repo_id, filename, subfolder=None, **_):
        return str(
            source / filename.removeprefix(source.name + "/")
            if subfolder is None
            else source / subfolder.removeprefix(source.name + "/") / filename
        )

    monkeypatch.setattr(pretrained_sae_loaders, "hf_hub_download", local)
    cfg, state, _ = pretrained_sae_loaders.llama_scope_sae_huggingface_loader(
        "fnlp/Llama3_1-8B-Base-LXR-8x", source.name, cfg_overrides={"dtype": "float32"}
    )
    sae = SAE.from_dict(cfg)
    sae.load_state_dict(state)
    sae.fold_activation_norm_scaling_factor(D**0.5 / average_norm)

    out = add_sae(model_dir, source, log=lambda _: None)
    x = residual_rows(3)
    assert_equal_to(sae, served(out, x), x)
    transcoder = dict(hyperparams, hook_point_out="blocks.1.hook_mlp_out")
    (source / "hyperparams.json").write_text(json.dumps(transcoder))
    with pytest.raises(SAEError, match="differ: a transcoder, not an SAE"):
        add_sae(model_dir, source, name="tc", log=lambda _: None)
