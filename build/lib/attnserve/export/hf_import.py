"""Hugging Face GPT-2-family checkpoints -> attnserve's Encoder.

GPT-2 is this project's block shape exactly (pre-LN, fused QKV, tanh GELU,
learned positions), so the mapping is a renaming plus one transpose: GPT-2
stores its projections as Conv1D weights, (in, out), where nn.Linear keeps
(out, in). Anything GPT-2 configs can switch on that this model cannot do is
refused with the config field named.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attnserve.model.checkpoint import first_shape_mismatch
from attnserve.model.config import ConfigError, ModelConfig
from attnserve.model.encoder import Encoder

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
# GPT2Config fields whose non-default values this model cannot reproduce.
UNSUPPORTED = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "add_cross_attention": False,
}
# Buffers some GPT-2 checkpoints carry: the causal mask, rebuilt by the model itself.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


class HFImportError(ValueError):
    """A checkpoint that cannot become this model; the message names the field or tensor."""


def config_from_hf(hf: dict, name: str) -> ModelConfig:
    if hf.get("model_type") != "gpt2":
        raise HFImportError(f"model_type is {hf.get('model_type')!r}; only 'gpt2' is supported")
    for field, wanted in UNSUPPORTED.items():
        if hf.get(field, wanted) != wanted:
            raise HFImportError(f"{field}={hf[field]!r} is not supported (only {wanted!r})")
    activation = hf.get("activation_function", "gelu_new")
    if activation not in ACTIVATIONS:
        raise HFImportError(
            f"activation_function={activation!r} is not supported (one of {sorted(ACTIVATIONS)})"
        )
    d_model = hf["n_embd"]
    eos = hf.get("eos_token_id", hf["vocab_size"] - 1)
    try:
        return ModelConfig(
            n_layers=hf["n_layer"],
            n_heads=hf["n_head"],
            d_model=d_model,
            d_ff=hf.get("n_inner") or 4 * d_model,
            max_seq_len=hf["n_positions"],
            vocab_size=hf["vocab_size"],
            tokenizer="hf",
            pad_id=eos,  # GPT-2 has no pad token; with right padding its value never matters
            bos_id=hf.get("bos_token_id", eos),
            eos_id=eos,
            activation=ACTIVATIONS[activation],
            layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
            bias=True,
            name=name,
        )
    except KeyError as exc:
        raise HFImportError(f"config.json lacks the field {exc.args[0]!r}") from exc
    except ConfigError as exc:
        raise HFImportError(f"config.json maps to an invalid model: {exc}") from exc


def _read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    safetensors_file = directory / "model.safetensors"
    if safetensors_file.is_file():
        from safetensors.torch import load_file

        return load_file(str(safetensors_file))
    bin_file = directory / "pytorch_model.bin"
    if bin_file.is_file():
        try:  # weights_only: tensors and plain containers only, nothing is unpickled freely
            return torch.load(bin_file, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise HFImportError(f"{bin_file} is not a plain tensor file: {exc}") from exc
    raise HFImportError(f"{directory} has neither model.safetensors nor pytorch_model.bin")


def _mapped(hf: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """HF names -> Encoder state_dict names, Conv1D weights transposed."""
    prefix = "transformer." if any(k.startswith("transformer.") for k in hf) else ""
    renames = {
        "wte.weight": "tok_emb.weight",
        "wpe.weight": "pos_emb.weight",
        "ln_f.weight": "ln_f.weight",
        "ln_f.bias": "ln_f.bias",
    }
    conv1d = {
        "attn.c_attn": "attn.qkv",
        "attn.c_proj": "attn.proj",
        "mlp.c_fc": "mlp.fc",
        "mlp.c_proj": "mlp.proj",
    }
    for i in range(n_layers):
        for ours, theirs in (("ln1", "ln_1"), ("ln2", "ln_2")):
            for p in ("weight", "bias"):
                renames[f"h.{i}.{theirs}.{p}"] = f"blocks.{i}.{ours}.{p}"
        for theirs, ours in conv1d.items():
            renames[f"h.{i}.{theirs}.weight"] = f"blocks.{i}.{ours}.weight"
            renames[f"h.{i}.{theirs}.bias"] = f"blocks.{i}.{ours}.bias"
    out = {}
    for theirs, ours in renames.items():
        tensor = hf.get(prefix + theirs)
        if tensor is None:
            raise HFImportError(f"missing tensor {prefix + theirs}")
        is_conv1d = theirs.endswith(".weight") and any(f".{c}." in theirs for c in conv1d)
        out[ours] = tensor.t().contiguous() if is_conv1d else tensor
    known = {prefix + k for k in renames} | {prefix + "lm_head.weight", "lm_head.weight"}
    unknown = sorted(k for k in hf if k not in known and not k.endswith(IGNORED_SUFFIXES))
    if unknown:
        raise HFImportError(f"unexpected tensor(s) {', '.join(unknown[:5])}")
    return out


def load_hf_gpt2(directory: str | Path) -> Encoder:
    """The GPT-2-family checkpoint in `directory` as an Encoder in eval mode (float32)."""
    directory = Path(directory)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise HFImportError(f"{directory} has no config.json")
    config = config_from_hf(json.loads(config_file.read_text()), name=directory.name)
    model = Encoder(config)
    tensors = _mapped(_read_tensors(directory), config.n_layers)
    if mismatch := first_shape_mismatch(model.state_dict(), tensors):
        raise HFImportError(f"{mismatch} (from config.json)")
    model.load_state_dict({k: v.float() for k, v in tensors.items()}, strict=True)
    return model.eval()
