"""What each Hugging Face model family is in this encoder's terms: its switches and its weights.

A family maps a checkpoint's config.json to ModelConfig fields (`switches`) and its
tensors to the encoder's state_dict (`weights`). Separate q/k/v and gate/up
projections are concatenated into the encoder's fused Linears; fused layouts that
interleave heads (GPT-NeoX) are reordered; GPT-2's Conv1D weights are transposed.
Whatever a family's config switches on that the encoder cannot reproduce exactly
is refused by `refuse_unsupported`, naming the field, before any tensor is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attnserve.model.config import ROPE_KINDS, ModelConfig, RopeScaling

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
    # Fields the families that use them take over (Family.handles): soft-capping and the
    # query scale (Gemma 2, 3), q/k norms (Qwen3, OLMo 2, Phi, StableLM), Granite's multipliers
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "query_pre_attn_scalar": None,
    "use_qk_norm": None,
    "qk_layernorm": False,
    "embedding_multiplier": 1.0,
    "attention_multiplier": None,
    "residual_multiplier": 1.0,
    "logits_scaling": 1.0,
    # What no family here reproduces, with the reason refuse_unsupported gives
    "use_bidirectional_attention": None,
    "num_local_experts": None,
    "num_experts": None,
    "n_routed_experts": None,
}
REASONS = {
    "use_bidirectional_attention": "bidirectional attention (Gemma embedders) is not causal",
    "num_local_experts": "mixtures of experts route each token through a few MLPs",
    "num_experts": "mixtures of experts route each token through a few MLPs",
    "n_routed_experts": "mixtures of experts route each token through a few MLPs",
}
# model types refused with their reason (docs/model.md, "What is refused")
EXPERTS = "a mixture of experts: each token goes through a few of many MLPs, routed"
LINEAR = "linear-attention layers (gated DeltaNet) have no attention probabilities"
STATEFUL = "computed statefully, as a recurrence: no attention probabilities there"
REFUSED_TYPES = {
    **dict.fromkeys(
        ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "phimoe", "granitemoe", "deepseek_v3"),
        EXPERTS,
    ),
    "gpt_oss": "a mixture of experts with attention sinks (rows that sum to less than 1)",
    **dict.fromkeys(("qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text"), LINEAR),
    **dict.fromkeys(("mamba", "mamba2", "falcon_mamba", "rwkv", "recurrent_gemma"), STATEFUL),
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

    def rope_parameters(self, layer_type: str = "full_attention") -> tuple[str, dict[str, Any]]:
        """(where they come from, the rope parameters of `layer_type`'s layers): from
        transformers 5's rope_parameters, flat or by layer type, or the older rope_scaling
        with the top-level rope_theta (Gemma 3's local layers: rope_local_base_freq)."""
        if any(t in self.rope for t in LAYER_TYPES):
            params = self.rope.get(layer_type) or {}
            return f"rope_parameters.{layer_type}", dict(params)
        if self.rope:
            return "rope_parameters", dict(self.rope)
        scaling = self.data.get("rope_scaling")
        params = dict(scaling) if isinstance(scaling, dict) else {}
        if layer_type == "sliding_attention":
            params = {"rope_theta": self.data.get("rope_local_base_freq")}
        if params.get("rope_theta") is None:
            params["rope_theta"] = self.rope_theta()
        return "rope_scaling", params


def rope_switches(hf: HFConfig, layered: bool = False) -> dict[str, Any]:
    """rope_theta and rope_scaling; layered (Gemma 3, OLMo 3): the sliding layers' own
    rotary too, which must not be scaled."""
    field, params = hf.rope_parameters("full_attention")
    switches: dict[str, Any] = dict(
        rope_theta=float(params.get("rope_theta") or hf.rope_theta()),
        rope_scaling=rope_scaling(hf, field, params),
    )
    if layered:
        field, local = hf.rope_parameters("sliding_attention")
        if local.get("rope_type", local.get("type", "default")) != "default":
            raise HFImportError(f"{field}: the sliding layers' rotary is only implemented unscaled")
        switches["sliding_rope_theta"] = float(local.get("rope_theta") or switches["rope_theta"])
    return switches


def rope_scaling(hf: HFConfig, field: str, params: dict[str, Any]) -> RopeScaling | None:
    """The RopeScaling of one set of rope parameters, with transformers' defaults and its
    derived values (YaRN's and LongRoPE's attention factors) resolved here."""
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return None
    if kind not in ROPE_KINDS:
        raise HFImportError(
            f"{field}: rope type {kind!r} is not implemented (only default, "
            f"{', '.join(ROPE_KINDS)}); its positions would differ from the checkpoint's"
        )

    def need(key: str) -> Any:
        value = params.get(key)
        if value is None and key == "original_max_position_embeddings":
            value = hf.get(key)
        if value is None:
            raise HFImportError(f"{field} lacks {key!r}, which rope type {kind!r} needs")
        return value

    longest = hf["max_position_embeddings"]
    if kind == "linear":
        return RopeScaling(kind, factor=float(need("factor")))
    if kind == "dynamic":  # transformers rescales past max_position_embeddings only
        return RopeScaling(kind, factor=float(need("factor")), original_max_seq_len=longest)
    original = int(need("original_max_position_embeddings"))
    if kind == "llama3":
        return RopeScaling(
            kind,
            factor=float(need("factor")),
            original_max_seq_len=original,
            low_freq_factor=float(need("low_freq_factor")),
            high_freq_factor=float(need("high_freq_factor")),
        )
    factor = float(params.get("factor") or longest / original)
    attention_factor = params.get("attention_factor")
    if kind == "yarn":
        if attention_factor is None:
            mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
            attention_factor = _yarn_mscale(factor, mscale or 1)
            if mscale and mscale_all_dim:
                attention_factor /= _yarn_mscale(factor, mscale_all_dim)
        return RopeScaling(
            kind,
            factor=factor,
            original_max_seq_len=original,
            beta_fast=float(params.get("beta_fast") or 32),
            beta_slow=float(params.get("beta_slow") or 1),
            # transformers reads truncate from the top level of rope_parameters
            truncate=bool(hf.rope.get("truncate", True)),
            attention_factor=float(attention_factor),
        )
    if attention_factor is None:  # longrope
        attention_factor = 1.0
        if factor > 1.0:
            attention_factor = math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeScaling(
        kind,
        factor=factor,
        original_max_seq_len=original,
        attention_factor=float(attention_factor),
        short_factor=tuple(float(f) for f in need("short_factor")),
    )


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _first_float(default: float, *values: Any) -> float:
    return next((float(v) for v in values if v is not None), default)


@dataclass(frozen=True)
class Family:
    prefixes: tuple[str, ...]  # of the tensor names: a *ForCausalLM's first, the bare model's
    switches: Callable[[HFConfig], dict[str, Any]]  # ModelConfig fields from config.json
    weights: Callable[[Take, ModelConfig], dict[str, torch.Tensor]]  # -> encoder state_dict
    handles: tuple[str, ...] = ()  # REQUIRED_VALUES fields this family reproduces
    # The model is config.json's text_config, its tensors the prefixed ones (a multimodal
    # checkpoint's language model; the vision tower is not read).
    text_config: bool = False
    # transformers' tie_word_embeddings for this type, where config.json leaves it out
    tied: bool = False
    head_bias: bool = False  # its LM head has a bias (Phi, GPT-J)


# Where a checkpoint keeps its own unembedding (outside the model's prefix), and its bias
UNEMBEDDING_NAMES = ("lm_head", "embed_out")


def unembedding_switches(hf: HFConfig, family: Family) -> dict[str, Any]:
    """Tied to the token table or a matrix of its own (with its bias where the family has
    one), as the checkpoint's tie_word_embeddings says."""
    tied = hf.data.get("tie_word_embeddings")
    if tied is None:
        tied = family.tied
    if tied:
        return {"unembedding": "tied"}
    return {"unembedding": "separate", "unembedding_bias": family.head_bias}


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


def rotary_switches(hf: HFConfig, layered_rope: bool = False) -> dict[str, Any]:
    """What every rotary family shares: sizes, rotary settings, sliding windows per layer;
    layered_rope: the sliding layers have a rotary of their own (rope_switches)."""
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
        **rope_switches(hf, layered_rope),
        rotary_fraction=hf.rotary_fraction(),
        activation=activation(hf, "hidden_act"),
        sliding_window=window,
        sliding_layers=sliding_layers,
    )


def with_layer_types(hf: HFConfig, sliding: Callable[[int], bool]) -> HFConfig:
    """hf with layer_types filled in where config.json leaves them to the family's default
    pattern (`sliding(i)`: layer i has the window)."""
    if hf.get("layer_types") is not None:
        return hf
    layers = range(hf["num_hidden_layers"])
    kinds = ["sliding_attention" if sliding(i) else "full_attention" for i in layers]
    return HFConfig({**hf.data, "layer_types": kinds})


def llama_switches(hf: HFConfig, layered_rope: bool = False) -> dict[str, Any]:
    """Llama, Mistral, Qwen2, Phi-3: RMSNorm, SwiGLU, rotary; biases as each config says."""
    attention_bias = bool(hf.get("attention_bias", False))
    return dict(
        rotary_switches(hf, layered_rope),
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


def gemma_switches(hf: HFConfig, layered_rope: bool = False) -> dict[str, Any]:
    return dict(
        llama_switches(hf, layered_rope),
        norm="rmsnorm_plus_one",
        embedding_scale=float(hf["hidden_size"] ** 0.5),
    )


def gemma2_switches(hf: HFConfig) -> dict[str, Any]:
    """Gemma 2: Gemma's, with four norms a block, the query_pre_attn_scalar scale, scores
    soft-capped, and a window on every other layer (the first included)."""
    hf = with_layer_types(hf, lambda i: i % 2 == 0)
    softcap = hf.get("attn_logit_softcapping")
    final = hf.data.get("final_logit_softcapping", 30.0)  # transformers' default: 30
    return (
        gemma_switches(hf)
        | _gemma2_block(hf)
        | {
            "attention_softcap": None if softcap is None else float(softcap),
            "logit_softcap": None if final is None else float(final),
        }
    )


def gemma3_switches(hf: HFConfig) -> dict[str, Any]:
    """Gemma 3: Gemma 2's block without the soft-cap (transformers ignores it), q/k norms,
    five local layers a global one, the local layers' own unscaled rotary."""
    pattern = hf.get("sliding_window_pattern", 6)
    hf = with_layer_types(hf, lambda i: (i + 1) % pattern != 0)
    final = hf.get("final_logit_softcapping")
    return (
        gemma_switches(hf, layered_rope=True)
        | _gemma2_block(hf)
        | {"qk_norm": "head", "logit_softcap": None if final is None else float(final)}
    )


def _gemma2_block(hf: HFConfig) -> dict[str, Any]:
    field = "hidden_activation" if hf.get("hidden_activation") else "hidden_act"
    return dict(
        activation=activation(hf, field),
        norm_placement="sandwich",
        attention_scale=float(hf.get("query_pre_attn_scalar", 256)) ** -0.5,
    )


def qwen3_switches(hf: HFConfig) -> dict[str, Any]:
    """Qwen3: Qwen2's window rule, no biases unless attention_bias, q/k RMSNorm per head."""
    attention_bias = bool(hf.get("attention_bias", False))
    return dict(
        qwen2_switches(hf), qkv_bias=attention_bias, out_bias=attention_bias, qk_norm="head"
    )


def olmo2_switches(hf: HFConfig, layered_rope: bool = False) -> dict[str, Any]:
    """OLMo 2: Llama's, its norms on each sublayer's output (none before), q/k norms over
    the whole projections."""
    return llama_switches(hf, layered_rope) | {"norm_placement": "output", "qk_norm": "projection"}


def olmo3_switches(hf: HFConfig) -> dict[str, Any]:
    """OLMo 3: OLMo 2's, three sliding layers a global one, the rope scaling (YaRN) on the
    global layers only."""
    return olmo2_switches(with_layer_types(hf, lambda i: (i + 1) % 4 != 0), layered_rope=True)


def granite_switches(hf: HFConfig) -> dict[str, Any]:
    """Granite: Llama's, with embedding, attention (the scale itself) and residual
    multipliers."""
    scale = hf.get("attention_multiplier")
    return dict(
        llama_switches(hf),
        embedding_scale=float(hf.get("embedding_multiplier", 1.0)),
        attention_scale=None if scale is None else float(scale),
        residual_scale=float(hf.get("residual_multiplier", 1.0)),
        logit_scale=1.0 / float(hf.get("logits_scaling", 1.0)),
    )


def phi_switches(hf: HFConfig) -> dict[str, Any]:
    """Phi 1, 1.5, 2: one LayerNorm feeding attention and MLP in parallel, partial rotary,
    biases everywhere, optional q/k LayerNorms over head_dim."""
    return dict(
        rotary_switches(hf),
        layer_norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
        bias=True,
        residual="parallel_one_norm",
        qk_norm="head" if hf.get("qk_layernorm", False) else None,
    )


def stablelm_switches(hf: HFConfig) -> dict[str, Any]:
    """StableLM: LayerNorms, SwiGLU, partial rotary, q/k/v biases by use_qkv_bias, a
    LayerNorm of each head's own on q and k by qk_layernorm, the parallel residual
    (one norm) by use_parallel_residual."""
    qkv_bias = bool(hf.get("use_qkv_bias", False))
    parallel = bool(hf.get("use_parallel_residual", False))
    return dict(
        rotary_switches(hf),
        layer_norm_eps=float(hf.get("layer_norm_eps", 1e-5)),
        mlp="gated",
        bias=False,
        qkv_bias=qkv_bias,
        residual="parallel_one_norm" if parallel else "sequential",
        qk_norm="each_head" if hf.get("qk_layernorm", False) else None,
    )


def gptj_switches(hf: HFConfig) -> dict[str, Any]:
    """GPT-J: GPT-2's sizes, no position table but rotary on the first rotary_dim dims of
    each head, pairs interleaved, one LayerNorm for a parallel block, no attention biases."""
    heads, d_model = hf["n_head"], hf["n_embd"]
    head_dim = d_model // heads
    return dict(
        gpt2_switches(hf),
        positions="rotary",
        rope_theta=10000.0,
        rotary_fraction=(hf.get("rotary_dim") or head_dim) / head_dim,
        rotary_interleaved=True,
        residual="parallel_one_norm",
        qkv_bias=False,
        out_bias=False,
    )


def opt_switches(hf: HFConfig) -> dict[str, Any]:
    """OPT: learned positions (offset by 2 in the table), ReLU, pre-norm, or post-norm
    without a final norm (opt-350m, whose narrower embeddings are projected in and out)."""
    if not hf.get("layer_norm_elementwise_affine", True):
        raise HFImportError("layer_norm_elementwise_affine=False is not supported (only True)")
    pre = bool(hf.get("do_layer_norm_before", True))
    if pre and hf.get("_remove_final_layer_norm", False):
        raise HFImportError("_remove_final_layer_norm=True is not supported (only False)")
    d_model = hf["hidden_size"]
    d_embed = hf.get("word_embed_proj_dim", d_model)
    return dict(
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        d_model=d_model,
        d_ff=hf["ffn_dim"],
        max_seq_len=hf["max_position_embeddings"],
        activation=activation(hf, "activation_function"),
        bias=bool(hf.get("enable_bias", True)),
        norm_placement="pre" if pre else "post",
        d_embed=None if d_embed == d_model else d_embed,
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


# Where each norm of a block is in a Llama-layout checkpoint, by norm placement.
LLAMA_NORMS = {
    "pre": {"ln1": "input_layernorm", "ln2": "post_attention_layernorm"},
    "sandwich": {
        "ln1": "input_layernorm",
        "ln1_out": "post_attention_layernorm",
        "ln2": "pre_feedforward_layernorm",
        "ln2_out": "post_feedforward_layernorm",
    },
    "output": {"ln1_out": "post_attention_layernorm", "ln2_out": "post_feedforward_layernorm"},
}


def _norm(out: dict[str, torch.Tensor], take: Take, ours: str, theirs: str) -> None:
    """A norm's weight, and its bias where the checkpoint has one (LayerNorm)."""
    out[f"{ours}.weight"] = take(f"{theirs}.weight")
    if (bias := _optional(take, f"{theirs}.bias")) is not None:
        out[f"{ours}.bias"] = bias


def llama_weights(take: Take, config: ModelConfig, fused: bool = False) -> dict[str, torch.Tensor]:
    """Llama, Mistral, Qwen2 and 3, Gemma 1-3, OLMo 2 and 3, Granite, StableLM;
    fused=True: Phi-3's qkv_proj and gate_up_proj."""
    out = {"tok_emb.weight": take("embed_tokens.weight")}
    _norm(out, take, "ln_f", "norm")
    norms = dict(LLAMA_NORMS[config.norm_placement])
    if config.residual == "parallel_one_norm":  # StableLM's parallel block
        del norms["ln2"]
    for i in range(config.n_layers):
        ours, theirs = f"blocks.{i}.", f"layers.{i}."
        for mine, hf in norms.items():
            _norm(out, take, f"{ours}{mine}", f"{theirs}{hf}")
        attn, mlp = f"{theirs}self_attn.", f"{theirs}mlp."
        if fused:
            _linear(out, take, f"{ours}attn.qkv", f"{attn}qkv_proj")
            _linear(out, take, f"{ours}mlp.fc", f"{mlp}gate_up_proj")
        else:
            _linear(out, take, f"{ours}attn.qkv", f"{attn}q_proj", f"{attn}k_proj", f"{attn}v_proj")
            _linear(out, take, f"{ours}mlp.fc", f"{mlp}gate_proj", f"{mlp}up_proj")
        _linear(out, take, f"{ours}attn.proj", f"{attn}o_proj")
        _linear(out, take, f"{ours}mlp.proj", f"{mlp}down_proj")
        if config.qk_norm == "each_head":  # StableLM: one LayerNorm module per head
            for q_or_k, heads in (("q", config.n_heads), ("k", config.kv_heads)):
                per_head = [
                    take(f"{attn}{q_or_k}_layernorm.norms.{h}.weight") for h in range(heads)
                ]
                out[f"{ours}attn.{q_or_k}_norm.weight"] = torch.stack(per_head)
        elif config.qk_norm is not None:
            _norm(out, take, f"{ours}attn.q_norm", f"{attn}q_norm")
            _norm(out, take, f"{ours}attn.k_norm", f"{attn}k_norm")
    return out


def phi_weights(take: Take, config: ModelConfig) -> dict[str, torch.Tensor]:
    out = {"tok_emb.weight": take("embed_tokens.weight")}
    _norm(out, take, "ln_f", "final_layernorm")
    for i in range(config.n_layers):
        ours, theirs = f"blocks.{i}.", f"layers.{i}."
        attn = f"{theirs}self_attn."
        _norm(out, take, f"{ours}ln1", f"{theirs}input_layernorm")
        _linear(out, take, f"{ours}attn.qkv", f"{attn}q_proj", f"{attn}k_proj", f"{attn}v_proj")
        _linear(out, take, f"{ours}attn.proj", f"{attn}dense")
        if config.qk_norm is not None:
            _norm(out, take, f"{ours}attn.q_norm", f"{attn}q_layernorm")
            _norm(out, take, f"{ours}attn.k_norm", f"{attn}k_layernorm")
        _linear(out, take, f"{ours}mlp.fc", f"{theirs}mlp.fc1")
        _linear(out, take, f"{ours}mlp.proj", f"{theirs}mlp.fc2")
    return out


def gptj_weights(take: Take, config: ModelConfig) -> dict[str, torch.Tensor]:
    out = {"tok_emb.weight": take("wte.weight")}
    _norm(out, take, "ln_f", "ln_f")
    for i in range(config.n_layers):
        ours, theirs = f"blocks.{i}.", f"h.{i}."
        attn = f"{theirs}attn."
        _norm(out, take, f"{ours}ln1", f"{theirs}ln_1")
        _linear(out, take, f"{ours}attn.qkv", f"{attn}q_proj", f"{attn}k_proj", f"{attn}v_proj")
        _linear(out, take, f"{ours}attn.proj", f"{attn}out_proj")
        _linear(out, take, f"{ours}mlp.fc", f"{theirs}mlp.fc_in")
        _linear(out, take, f"{ours}mlp.proj", f"{theirs}mlp.fc_out")
    return out


OPT_POSITION_OFFSET = 2  # OPT's table starts with two rows no position uses


def opt_weights(take: Take, config: ModelConfig) -> dict[str, torch.Tensor]:
    start = OPT_POSITION_OFFSET
    out = {
        "tok_emb.weight": take("embed_tokens.weight"),
        "pos_emb.weight": take("embed_positions.weight")[start : start + config.max_seq_len],
    }
    if config.d_embed is not None:
        out["embed_in.weight"] = take("project_in.weight")
        out["embed_out.weight"] = take("project_out.weight")
    if config.norm_placement != "post":
        _norm(out, take, "ln_f", "final_layer_norm")
    for i in range(config.n_layers):
        ours, theirs = f"blocks.{i}.", f"layers.{i}."
        attn = f"{theirs}self_attn."
        _norm(out, take, f"{ours}ln1", f"{theirs}self_attn_layer_norm")
        _norm(out, take, f"{ours}ln2", f"{theirs}final_layer_norm")
        _linear(out, take, f"{ours}attn.qkv", f"{attn}q_proj", f"{attn}k_proj", f"{attn}v_proj")
        _linear(out, take, f"{ours}attn.proj", f"{attn}out_proj")
        _linear(out, take, f"{ours}mlp.fc", f"{theirs}fc1")
        _linear(out, take, f"{ours}mlp.proj", f"{theirs}fc2")
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


LLAMA = ("model.", "")
GEMMA2_HANDLES = ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar")
FAMILIES = {
    "gpt2": Family(("transformer.", ""), gpt2_switches, gpt2_weights, tied=True),
    "llama": Family(LLAMA, llama_switches, llama_weights),
    "mistral": Family(LLAMA, llama_switches, llama_weights),
    "qwen2": Family(LLAMA, qwen2_switches, llama_weights),
    "qwen3": Family(LLAMA, qwen3_switches, llama_weights),
    "gemma": Family(LLAMA, gemma_switches, llama_weights, tied=True),
    "gemma2": Family(LLAMA, gemma2_switches, llama_weights, GEMMA2_HANDLES, tied=True),
    "gemma3_text": Family(LLAMA, gemma3_switches, llama_weights, GEMMA2_HANDLES, tied=True),
    # Gemma 3 from 4b up is multimodal: its language model, under either spelling
    "gemma3": Family(
        ("model.language_model.", "language_model.model."),
        gemma3_switches,
        llama_weights,
        GEMMA2_HANDLES,
        text_config=True,
        tied=True,
    ),
    "olmo2": Family(LLAMA, olmo2_switches, llama_weights),
    "olmo3": Family(LLAMA, olmo3_switches, llama_weights),
    "granite": Family(
        LLAMA,
        granite_switches,
        llama_weights,
        ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"),
    ),
    "phi": Family(LLAMA, phi_switches, phi_weights, ("qk_layernorm",), head_bias=True),
    "phi3": Family(LLAMA, llama_switches, phi3_weights),
    "stablelm": Family(LLAMA, stablelm_switches, llama_weights, ("qk_layernorm",)),
    "gpt_neox": Family(("gpt_neox.", ""), neox_switches, neox_weights),
    "gptj": Family(("transformer.", ""), gptj_switches, gptj_weights, head_bias=True),
    "opt": Family(("model.decoder.", "decoder.", ""), opt_switches, opt_weights, tied=True),
}
IGNORED_NAMES = ("lm_head.weight", "lm_head.bias", "embed_out.weight")
IGNORED_SUFFIXES = (
    ".attn.bias",
    ".attn.masked_bias",
    ".attention.bias",
    ".attention.masked_bias",
    ".rotary_emb.inv_freq",
    ".attn.embed_positions",  # GPT-J's sin/cos table
)


def refuse_unsupported(hf: HFConfig, family: Family | None = None) -> None:
    """Raise HFImportError naming the first field whose value the encoder cannot reproduce
    (rope types are checked by the family's switches)."""
    handled = family.handles if family is not None else ()
    for field, wanted in REQUIRED_VALUES.items():
        value = hf.data.get(field)
        if field in handled or value is None or value == wanted:
            continue
        if wanted is None and value is False:
            continue
        reason = REASONS.get(field, f"only {wanted!r}")
        raise HFImportError(f"{field}={value!r} is not supported ({reason})")
