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

Transcoders (model/sae_config.py): SAELens' transcoder, skip_transcoder,
jumprelu_transcoder and jumprelu_skip_transcoder directories (as its SAEs', d_out and
metadata.hook_name_out beside), and circuit-tracer's transcoder sets: a directory with
`config.yaml` (model_kind transcoder_set, feature_input_hook, feature_output_hook, and the
layers' files as `transcoders` or `layer_{i}.safetensors` beside it), each layer's file
holding W_enc and W_dec (d_transcoder, d_model), b_enc, b_dec, optionally
`activation_function.threshold` (JumpReLU; else ReLU) and W_skip (applied as x @ W_skip.T).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from attnserve.model.sae_config import ARCHITECTURES, NORMALIZATIONS, SAEConfig

GEMMA_SCOPE_FILE = "params.npz"
CIRCUIT_TRACER_CONFIG = "config.yaml"
# SAELens' transcoders' architectures -> (the activation's, with a skip connection)
TRANSCODER_ARCHITECTURES = {
    "transcoder": ("standard", False),
    "skip_transcoder": ("standard", True),
    "jumprelu_transcoder": ("jumprelu", False),
    "jumprelu_skip_transcoder": ("jumprelu", True),
}
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
    if architecture in TRANSCODER_ARCHITECTURES:
        return _saelens_transcoder(cfg_path, cfg, hook), _weights(weights_path)
    if architecture not in ARCHITECTURES:
        known = (*ARCHITECTURES, *TRANSCODER_ARCHITECTURES)
        raise SAEError(f"{cfg_path}: architecture {architecture!r} is not one of {known}")
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
    return config, _weights(weights_path)


def _weights(path: Path) -> Weights:
    return {name: t.float() for name, t in load_file(path).items()}


def _saelens_transcoder(cfg_path: Path, cfg: dict, hook: str) -> SAEConfig:
    """A SAELens transcoder's config: its output site in metadata.hook_name_out."""
    metadata = cfg.get("metadata") or {}
    hook_out = metadata.get("hook_name_out") or cfg.get("hook_name_out")
    if not hook_out:
        raise SAEError(f"{cfg_path}: a transcoder without metadata.hook_name_out")
    if cfg.get("apply_b_dec_to_input"):
        raise SAEError(f"{cfg_path}: apply_b_dec_to_input is not a transcoder's")
    normalize = cfg.get("normalize_activations") or "none"
    if normalize != "none":
        raise SAEError(f"{cfg_path}: a transcoder normalizing its input ({normalize!r})")
    activation, skip = TRANSCODER_ARCHITECTURES[cfg["architecture"]]
    return SAEConfig(
        architecture=activation,
        d_in=int(cfg["d_in"]),
        d_sae=int(cfg["d_sae"]),
        hook_name=hook,
        apply_b_dec_to_input=False,
        hook_name_out=hook_out,
        d_out=int(cfg.get("d_out") or cfg["d_in"]),
        skip=skip,
    )


def transcoder_set_scan(source: Path) -> str | None:
    """circuit-tracer's identifier of the set at `source` (config.yaml's `scan`), if any."""
    import yaml

    scan = (yaml.safe_load((source / CIRCUIT_TRACER_CONFIG).read_text()) or {}).get("scan")
    return None if scan is None else "-".join(scan) if isinstance(scan, list) else str(scan)


def read_transcoder_set(source: Path) -> list[tuple[int, SAEConfig, Weights]]:
    """circuit-tracer's transcoder set at `source` (a directory with config.yaml): each
    layer's (layer, config, weights), in SAELens' layout (W_enc (d_in, d_sae))."""
    import yaml  # safe_load: plain data, never objects

    cfg_path = source / CIRCUIT_TRACER_CONFIG
    cfg = yaml.safe_load(cfg_path.read_text()) or {}
    kind = cfg.get("model_kind")
    if kind != "transcoder_set":
        raise SAEError(
            f"{cfg_path}: model_kind {kind!r}; per-layer transcoders (transcoder_set) are "
            "served, cross-layer ones are not"
        )
    hooks = []
    for field in ("feature_input_hook", "feature_output_hook"):
        if not cfg.get(field):
            raise SAEError(f"{cfg_path}: no {field}")
        hooks.append(str(cfg[field]))
    files = [Path(path) for path in cfg.get("transcoders") or ()]
    for path in files:
        if str(path).startswith("hf:"):
            raise SAEError(
                f"{cfg_path}: transcoders name {path}, on the Hugging Face Hub: download the "
                "set and name local files (or put layer_{i}.safetensors beside config.yaml)"
            )
    folder = source / cfg.get("subfolder", "")
    count = len(list(folder.glob("layer_*.safetensors")))
    files = [source / p for p in files] or [folder / f"layer_{i}.safetensors" for i in range(count)]
    if not files:
        raise SAEError(f"{source}: config.yaml lists no transcoders and no layer_*.safetensors")
    return [
        (layer, *_circuit_tracer_layer(path, layer, *hooks)) for layer, path in enumerate(files)
    ]


def _circuit_tracer_layer(
    path: Path, layer: int, input_hook: str, output_hook: str
) -> tuple[SAEConfig, Weights]:
    if not path.is_file():
        raise SAEError(f"{path}: no such transcoder file (layer {layer})")
    loaded = _weights(path)
    for name in ("W_enc", "W_dec", "b_enc", "b_dec"):
        if name not in loaded:
            raise SAEError(f"{path}: no {name}")
    weights = {
        "W_enc": loaded["W_enc"].T.contiguous(),  # (d_transcoder, d_model) -> (d_in, d_sae)
        "W_dec": loaded["W_dec"],
        "b_enc": loaded["b_enc"],
        "b_dec": loaded["b_dec"],
    }
    threshold = loaded.get("activation_function.threshold")
    if threshold is not None:
        if (threshold < 0).any():  # x * (x > t) passes negative values a ReLU would not
            raise SAEError(f"{path}: a negative JumpReLU threshold is not served")
        weights["threshold"] = threshold.expand(weights["b_enc"].shape).contiguous()
    if "W_skip" in loaded:
        weights["W_skip"] = loaded["W_skip"]
    d_sae, d_in = loaded["W_enc"].shape
    config = SAEConfig(
        architecture="standard" if threshold is None else "jumprelu",
        d_in=int(d_in),
        d_sae=int(d_sae),
        hook_name=f"blocks.{layer}.{input_hook}",
        apply_b_dec_to_input=False,
        hook_name_out=f"blocks.{layer}.{output_hook}",
        d_out=int(loaded["W_dec"].shape[1]),
        skip="W_skip" in loaded,
    )
    return config, weights


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
