"""The formats sparse autoencoders are published in, read into an SAEConfig and float32
weights named as model/sae.py names them (SAELens' names). Nothing is unpickled.

- SAELens' own directory (`SAE.save_model`): `cfg.json` (architecture, d_in, d_sae,
  apply_b_dec_to_input, normalize_activations, k for topk; the hook in
  metadata.hook_name, hook_name or the older hook_point) and `sae_weights.safetensors`.
  SAELens saves a BatchTopK SAE as jumprelu with its learned threshold: served as that.
- Gemma Scope's `params.npz` (a file, or the folder holding it): W_enc, W_dec, b_enc, b_dec
  and threshold of a JumpReLU SAE that does not subtract b_dec from its input; the site
  is not in the file (name it with --hook).
- Llama Scope's directory (`hyperparams.json`, `checkpoints/final.safetensors`): a JumpReLU
  SAE with one threshold, trained on inputs scaled to norm sqrt(d_model) on average; that
  dataset-wide scale is folded into the weights as SAELens' loader and from_pretrained
  fold it (W_enc times it, W_dec and b_dec over it, the threshold times it).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from attnserve.model.sae_config import ARCHITECTURES, NORMALIZATIONS, SAEConfig

GEMMA_SCOPE_FILE = "params.npz"
LLAMA_SCOPE_CONFIG, LLAMA_SCOPE_WEIGHTS = "hyperparams.json", "checkpoints/final.safetensors"

Weights = dict[str, torch.Tensor]


class SAEError(ValueError):
    """An SAE that cannot be read, or served with this model; the message names the field."""


def read_sae(source: Path, hook: str | None = None) -> tuple[SAEConfig, Weights]:
    """The SAE at `source` (any format above): its config, `hook` overriding its site."""
    if source.suffix == ".npz":
        return read_gemma_scope(source, hook)
    if (source / GEMMA_SCOPE_FILE).is_file():
        return read_gemma_scope(source / GEMMA_SCOPE_FILE, hook)
    if (source / LLAMA_SCOPE_CONFIG).is_file():
        return read_llama_scope(source, hook)
    return read_saelens(source, hook)


def read_saelens(source: Path, hook: str | None = None) -> tuple[SAEConfig, Weights]:
    """An SAE saved by SAELens (`SAE.save_model`)."""
    cfg_path, weights_path = source / "cfg.json", source / "sae_weights.safetensors"
    for path in (cfg_path, weights_path):
        if not path.is_file():
            raise SAEError(
                f"{source} is not an SAE directory: no {path.name} (SAELens), "
                f"{GEMMA_SCOPE_FILE} (Gemma Scope) or {LLAMA_SCOPE_CONFIG} (Llama Scope)"
            )
    cfg = json.loads(cfg_path.read_text())
    metadata = cfg.get("metadata") or {}
    hook = hook or metadata.get("hook_name") or cfg.get("hook_name") or cfg.get("hook_point")
    if not hook:
        raise SAEError(f"{cfg_path}: no metadata.hook_name (or hook_point); name it with --hook")
    architecture = cfg.get("architecture", "standard")
    if architecture not in ARCHITECTURES:
        raise SAEError(f"{cfg_path}: architecture {architecture!r} is not one of {ARCHITECTURES}")
    normalize = cfg.get("normalize_activations") or "none"
    if normalize not in NORMALIZATIONS:
        raise SAEError(
            f"{cfg_path}: normalize_activations {normalize!r} is not one of {NORMALIZATIONS}"
        )
    config = SAEConfig(
        architecture=architecture,
        d_in=int(cfg["d_in"]),
        d_sae=int(cfg["d_sae"]),
        hook_name=hook,
        apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)),
        normalize_activations=normalize,
        k=int(cfg.get("k", 0)) if architecture == "topk" else 0,
        rescale_acts_by_decoder_norm=bool(cfg.get("rescale_acts_by_decoder_norm", False)),
    )
    return config, {name: t.float() for name, t in load_file(weights_path).items()}


def read_gemma_scope(path: Path, hook: str | None) -> tuple[SAEConfig, Weights]:
    """A Gemma Scope `params.npz` (as SAELens' gemma_2 loader reads it: w_* keys renamed
    W_*; a scaling_factor of ones dropped, any other refused)."""
    if not hook:
        raise SAEError(
            f"{path}: Gemma Scope's params.npz does not name its site; give --hook "
            "(e.g. blocks.12.hook_resid_post for gemma-scope-2b-pt-res/layer_12)"
        )
    with np.load(path, allow_pickle=False) as data:
        weights = {
            ("W_" + key[2:] if key.startswith("w_") else key): torch.from_numpy(
                np.asarray(data[key], dtype=np.float32)
            )
            for key in data.files
        }
    scale = weights.pop("scaling_factor", None)
    if scale is not None and not torch.all(scale == 1):
        raise SAEError(f"{path}: a scaling_factor other than 1 is not served")
    d_in, d_sae = _shape(path, weights)
    config = SAEConfig("jumprelu", d_in, d_sae, hook, apply_b_dec_to_input=False)
    return config, weights


def read_llama_scope(source: Path, hook: str | None) -> tuple[SAEConfig, Weights]:
    """A Llama Scope SAE's directory, its dataset-wide input norm folded into the weights."""
    cfg_path, weights_path = source / LLAMA_SCOPE_CONFIG, source / LLAMA_SCOPE_WEIGHTS
    if not weights_path.is_file():
        raise SAEError(f"{source} is a Llama Scope directory without {LLAMA_SCOPE_WEIGHTS}")
    cfg = json.loads(cfg_path.read_text())
    hook_in = cfg.get("hook_point_in")
    hook_out = cfg.get("hook_point_out", hook_in)
    if hook_in != hook_out:
        raise SAEError(
            f"{cfg_path}: hook_point_in {hook_in!r} and hook_point_out {hook_out!r} differ: "
            "a transcoder, not an SAE"
        )
    loaded = load_file(weights_path)
    weights = {
        "W_enc": loaded["encoder.weight"].float().T.contiguous(),
        "b_enc": loaded["encoder.bias"].float(),
        "W_dec": loaded["decoder.weight"].float().T.contiguous(),
        "b_dec": loaded["decoder.bias"].float(),
    }
    d_in, d_sae = _shape(weights_path, weights)
    scale = 1.0
    if cfg.get("norm_activation") == "dataset-wise":
        scale = d_in**0.5 / float(cfg["dataset_average_activation_norm"]["in"])
        weights["W_enc"] *= scale
        weights["W_dec"] /= scale
        weights["b_dec"] /= scale
    weights["threshold"] = torch.full((d_sae,), float(cfg["jump_relu_threshold"]) * scale)
    config = SAEConfig("jumprelu", d_in, d_sae, hook or hook_in, apply_b_dec_to_input=False)
    return config, weights


def _shape(path: Path, weights: Weights) -> tuple[int, int]:
    """(d_in, d_sae) of W_enc."""
    if "W_enc" not in weights or weights["W_enc"].ndim != 2:
        raise SAEError(f"{path}: no W_enc matrix (d_in, d_sae)")
    d_in, d_sae = weights["W_enc"].shape
    return int(d_in), int(d_sae)
