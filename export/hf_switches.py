"""config.json -> ModelConfig fields, family by family (`<family>_switches`): the rotary
positions and their scaling, norms, activations, biases and each family's own settings."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from attnserve.export.hf_config import LAYER_TYPES, HFConfig, HFImportError
from attnserve.model.config import ACTIVATIONS, ROPE_KINDS, RopeScaling

# a Hugging Face config's activation -> ours
_ACTIVATION_OF = {hf: ours for ours, names in ACTIVATIONS.items() for hf in names}


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


def activation(hf: HFConfig, field: str) -> str:
    name = hf.get(field, "gelu_new")
    if name not in _ACTIVATION_OF:
        raise HFImportError(f"{field}={name!r} is not supported (one of {sorted(_ACTIVATION_OF)})")
    return _ACTIVATION_OF[name]


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
