"""What each Hugging Face model family is in this encoder's terms: its switches and its weights.

A family maps a checkpoint's config.json to ModelConfig fields (`switches`) and its
tensors to the encoder's state_dict (`weights`). Separate q/k/v and gate/up
projections are concatenated into the encoder's fused Linears; fused layouts that
interleave heads (GPT-NeoX) are reordered; GPT-2's Conv1D weights are transposed.
Whatever a family's config switches on that the encoder cannot reproduce exactly
is refused by `refuse_unsupported`, naming the field, before any tensor is read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attnserve.model.config import ModelConfig

ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
# Config fields that must keep these values (missing counts as the value): anything else
# changes the math in a way the encoder does not reproduce.
REQUIRED_VALUES: dict[str, Any] = {
    # GPT-2
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "add_cross_attention": False,
    # soft-capping (Gemma 2), bidirectional attention (Gemma embedders), mixtures of experts
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "use_bidirectional_attention": None,
    "num_local_experts": None,
    "num_experts": None,
    "query_pre_attn_scalar": None,
    "use_qk_norm": None,
}
LAYER_TYPES = ("full_attention", "sliding_attention")
Take = Callable[[str], torch.Tensor]  # a checkpoint tensor by its name without the prefix


class HFImportError(ValueError):
    """A checkpoint that cannot become this model; the message names the field or tensor."""


class HFConfig:
    """A config.json, read with both spellings found in real checkpoints: transformers 5's
    `rope_parameters` and the older top-level `rope_theta`, `rotary_pct`, `rope_scaling`."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        rope = data.get("rope_parameters") or {}
        self.rope = rope if isinstance(rope, dict) else {}

    def __getitem__(self, key: str) -> Any:
        if self.data.get(key) is None:
            raise HFImportError(f"config.json lacks the field {key!r}")
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def rope_theta(self) -> float:
        return _first_float(
            10000.0,
            self.rope.get("rope_theta"),
            self.data.get("rope_theta"),
            self.data.get("rotary_emb_base"),  # GPT-NeoX before transformers 5
        )

    def rotary_fraction(self) -> float:
        return _first_float(
            1.0,
            self.rope.get("partial_rotary_factor"),
            self.data.get("partial_rotary_factor"),
            self.data.get("rotary_pct"),  # GPT-NeoX before transformers 5
        )

    def rope_type(self) -> tuple[str, str]:
        """(the field that names it, the rope type): "default" is the only one implemented."""
        if self.rope.get("rope_type") not in (None, "default"):
            return "rope_parameters.rope_type", str(self.rope["rope_type"])
        scaling = self.data.get("rope_scaling")
        if isinstance(scaling, dict):
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind != "default":
                return "rope_scaling", str(kind)
        return "rope_parameters.rope_type", "default"


def _first_float(default: float, *values: Any) -> float:
    return next((float(v) for v in values if v is not None), default)


@dataclass(frozen=True)
class Family:
    prefixes: tuple[str, ...]  # of the tensor names: a *ForCausalLM's first, the bare model's
    switches: Callable[[HFConfig], dict[str, Any]]  # ModelConfig fields from config.json
    weights: Callable[[Take, ModelConfig], dict[str, torch.Tensor]]  # -> encoder state_dict


# --- config.json -> ModelConfig fields ----------------------------------------------------


def activation(hf: HFConfig, field: str) -> str:
    name = hf.get(field, "gelu_new")
    if name not in ACTIVATIONS:
        raise HFImportError(f"{field}={name!r} is not supported (one of {sorted(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def gpt2_switches(hf: HFConfig) -> dict[str, Any]:
    d_model = hf["n_embd"]
    return dict(
        n_layers=hf["n_layer"],
        n_heads=hf["n_head"],
        d_model=d_model,
        d_ff=hf.get("n_inner") or 4 * d_model,
        max_seq_len=hf["n_positions"],
        activation=activation(hf, "activation_function"),
        layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        bias=True,
    )


def rotary_switches(hf: HFConfig) -> dict[str, Any]:
    """What every rotary family shares: sizes, rotary settings, sliding windows per layer."""
    heads = hf["num_attention_heads"]
    window = hf.get("sliding_window")
    layer_types = hf.get("layer_types")
    sliding_layers = None
    if layer_types is not None:
        unknown = sorted(set(layer_types) - set(LAYER_TYPES))
        if unknown:
            raise HFImportError(f"layer_types {unknown} are not supported (only {LAYER_TYPES})")
        sliding_layers = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
        if window is None or not sliding_layers:
            window, sliding_layers = None, None
    return dict(
        n_layers=hf["num_hidden_layers"],
        n_heads=heads,
        n_kv_heads=hf.get("num_key_value_heads", heads),
        d_model=hf["hidden_size"],
        d_head=hf.get("head_dim"),
        d_ff=hf["intermediate_size"],
        max_seq_len=hf["max_position_embeddings"],
        positions="rotary",
        rope_theta=hf.rope_theta(),
        rotary_fraction=hf.rotary_fraction(),
        activation=activation(hf, "hidden_act"),
        sliding_window=window,
        sliding_layers=sliding_layers,
    )


def llama_switches(hf: HFConfig) -> dict[str, Any]:
    """Llama, Mistral, Qwen2, Phi-3: RMSNorm, SwiGLU, rotary; biases as each config says."""
    attention_bias = bool(hf.get("attention_bias", False))
    return dict(
        rotary_switches(hf),
        norm="rmsnorm",
        layer_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        mlp="gated",
        bias=False,
        qkv_bias=attention_bias,
        out_bias=attention_bias,
        mlp_bias=bool(hf.get("mlp_bias", False)),
    )


def qwen2_switches(hf: HFConfig) -> dict[str, Any]:
    switches = llama_switches(hf)
    if not hf.get("use_sliding_window", False):  # Qwen2's window is off unless switched on
        switches.update(sliding_window=None, sliding_layers=None)
    elif switches["sliding_layers"] is None and switches["sliding_window"] is not None:
        first = hf.get("max_window_layers", 0)  # layers from this one on use the window
        switches["sliding_layers"] = tuple(range(first, switches["n_layers"]))
    return dict(switches, qkv_bias=True, out_bias=False)  # Qwen2's fixed bias layout


def gemma_switches(hf: HFConfig) -> dict[str, Any]:
    return dict(
        llama_switches(hf),
        norm="rmsnorm_plus_one",
        embedding_scale=float(hf["hidden_size"] ** 0.5),
    )


def neox_switches(hf: HFConfig) -> dict[str, Any]:
    attention_bias = bool(hf.get("attention_bias", True))
    return dict(
        rotary_switches(hf),
        layer_norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
        bias=True,
        qkv_bias=attention_bias,
        out_bias=attention_bias,
        residual="parallel" if hf.get("use_parallel_residual", True) else "sequential",
    )


# --- tensors -> the encoder's state_dict ---------------------------------------------------


def gpt2_weights(take: Take, config: ModelConfig) -> dict[str, torch.Tensor]:
    def conv1d(name: str) -> torch.Tensor:  # Conv1D keeps (in, out); Linear (out, in)
        return take(name).t().contiguous()

    out = {
        "tok_emb.weight": take("wte.weight"),
        "pos_emb.weight": take("wpe.weight")[: config.max_seq_len],  # --max-seq-len may cut
        "ln_f.weight": take("ln_f.weight"),
        "ln_f.bias": take("ln_f.bias"),
    }
    for i in range(config.n_layers):
        ours, theirs = f"blocks.{i}.", f"h.{i}."
        for p in ("weight", "bias"):
            out[f"{ours}ln1.{p}"] = take(f"{theirs}ln_1.{p}")
            out[f"{ours}ln2.{p}"] = take(f"{theirs}ln_2.{p}")
        for mine, gpt2 in (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj")):
            out[f"{ours}{mine}.weight"] = conv1d(f"{theirs}{gpt2}.weight")
            out[f"{ours}{mine}.bias"] = take(f"{theirs}{gpt2}.bias")
        for mine, gpt2 in (("mlp.fc", "mlp.c_fc"), ("mlp.proj", "mlp.c_proj")):
            out[f"{ours}{mine}.weight"] = conv1d(f"{theirs}{gpt2}.weight")
            out[f"{ours}{mine}.bias"] = take(f"{theirs}{gpt2}.bias")
    return out


def _optional(take: Take, name: str) -> torch.Tensor | None:
    try:
        return take(name)
    except HFImportError:
        return None


def _linear(out: dict[str, torch.Tensor], take: Take, ours: str, *theirs: str) -> None:
    """One encoder Linear from one or more HF Linears, concatenated along the outputs.
    Biases are taken where the checkpoint has them; the shape check catches a missing one."""
    out[f"{ours}.weight"] = torch.cat([take(f"{t}.weight") for t in theirs])
    biases = [_optional(take, f"{t}.bias") for t in theirs]
    if any(b is not None for b in biases):
        if any(b is None for b in biases):
            missing = [f"{t}.bias" for t, b in zip(theirs, biases, strict=True) if b is None]
            raise HFImportError(f"missing tensor {missing[0]}")
        out[f"{ours}.bias"] = torch.cat([b for b in biases if b is not None])


def llama_weights(take: Take, config: ModelConfig, fused: bool = False) -> dict[str, torch.Tensor]:
    """Llama, Mistral, Qwen2, Gemma; fused=True: Phi-3's qkv_proj and gate_up_proj."""
    out = {"tok_emb.weight": take("embed_tokens.weight"), "ln_f.weight": take("norm.weight")}
    for i in range(config.n_layers):
        ours, theirs = f"blocks.{i}.", f"layers.{i}."
        out[f"{ours}ln1.weight"] = take(f"{theirs}input_layernorm.weight")
        out[f"{ours}ln2.weight"] = take(f"{theirs}post_attention_layernorm.weight")
        attn, mlp = f"{theirs}self_attn.", f"{theirs}mlp."
        if fused:
            _linear(out, take, f"{ours}attn.qkv", f"{attn}qkv_proj")
            _linear(out, take, f"{ours}mlp.fc", f"{mlp}gate_up_proj")
        else:
            _linear(out, take, f"{ours}attn.qkv", f"{attn}q_proj", f"{attn}k_proj", f"{attn}v_proj")
            _linear(out, take, f"{ours}mlp.fc", f"{mlp}gate_proj", f"{mlp}up_proj")
        _linear(out, take, f"{ours}attn.proj", f"{attn}o_proj")
        _linear(out, take, f"{ours}mlp.proj", f"{mlp}down_proj")
    return out


def phi3_weights(take: Take, config: ModelConfig) -> dict[str, torch.Tensor]:
    return llama_weights(take, config, fused=True)


def neox_weights(take: Take, config: ModelConfig) -> dict[str, torch.Tensor]:
    out = {
        "tok_emb.weight": take("embed_in.weight"),
        "ln_f.weight": take("final_layer_norm.weight"),
        "ln_f.bias": take("final_layer_norm.bias"),
    }
    for i in range(config.n_layers):
        ours, theirs = f"blocks.{i}.", f"layers.{i}."
        for p in ("weight", "bias"):
            out[f"{ours}ln1.{p}"] = take(f"{theirs}input_layernorm.{p}")
            out[f"{ours}ln2.{p}"] = take(f"{theirs}post_attention_layernorm.{p}")
        _linear(out, take, f"{ours}attn.qkv", f"{theirs}attention.query_key_value")
        for p in ("weight", "bias"):  # NeoX interleaves heads, (H, 3, d_k): make it q | k | v
            if (t := out.get(f"{ours}attn.qkv.{p}")) is not None:
                per_head = t.reshape(config.n_heads, 3, config.head_dim, *t.shape[1:])
                out[f"{ours}attn.qkv.{p}"] = per_head.transpose(0, 1).reshape(t.shape)
        _linear(out, take, f"{ours}attn.proj", f"{theirs}attention.dense")
        _linear(out, take, f"{ours}mlp.fc", f"{theirs}mlp.dense_h_to_4h")
        _linear(out, take, f"{ours}mlp.proj", f"{theirs}mlp.dense_4h_to_h")
    return out


FAMILIES = {
    "gpt2": Family(("transformer.", ""), gpt2_switches, gpt2_weights),
    "llama": Family(("model.", ""), llama_switches, llama_weights),
    "mistral": Family(("model.", ""), llama_switches, llama_weights),
    "qwen2": Family(("model.", ""), qwen2_switches, llama_weights),
    "gemma": Family(("model.", ""), gemma_switches, llama_weights),
    "phi3": Family(("model.", ""), llama_switches, phi3_weights),
    "gpt_neox": Family(("gpt_neox.", ""), neox_switches, neox_weights),
}
# Tensors a checkpoint may carry that the encoder rebuilds or does not use: unembeddings
# (the encoder returns hidden states, tied or not), causal-mask and rotary buffers.
IGNORED_NAMES = ("lm_head.weight", "embed_out.weight")
IGNORED_SUFFIXES = (
    ".attn.bias",
    ".attn.masked_bias",
    ".attention.bias",
    ".attention.masked_bias",
    ".rotary_emb.inv_freq",
)


def refuse_unsupported(hf: HFConfig) -> None:
    """Raise HFImportError naming the first field whose value the encoder cannot reproduce."""
    for field, wanted in REQUIRED_VALUES.items():
        value = hf.data.get(field)
        if value is not None and value != wanted and not (wanted is None and value is False):
            raise HFImportError(f"{field}={value!r} is not supported (only {wanted!r})")
    field, kind = hf.rope_type()
    if kind != "default":
        raise HFImportError(
            f"{field}: rope type {kind!r} is not implemented (only the default rotary "
            "embedding); its positions would differ from the checkpoint's"
        )
