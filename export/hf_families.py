"""What each Hugging Face model family is in this encoder's terms: the table of families.

A family maps a checkpoint's config.json to ModelConfig fields (`switches`, in
export/hf_switches.py) and its tensors to the encoder's state_dict (`weights`, in
export/hf_weights.py). Whatever a family's config switches on that the encoder cannot
reproduce exactly is refused by `refuse_unsupported`, naming the field, before any tensor
is read; whole model types are refused with their reason (REFUSED_TYPES).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnserve.export.hf_config import HFConfig, HFImportError
from attnserve.export.hf_switches import (
    gemma2_switches,
    gemma3_switches,
    gemma_switches,
    gpt2_switches,
    gptj_switches,
    granite_switches,
    llama_switches,
    neox_switches,
    olmo2_switches,
    olmo3_switches,
    opt_switches,
    phi_switches,
    qwen2_switches,
    qwen3_switches,
    stablelm_switches,
)
from attnserve.export.hf_weights import (
    Loads,
    Take,
    gpt2_weights,
    gptj_weights,
    llama_weights,
    neox_weights,
    opt_weights,
    phi3_weights,
    phi_weights,
)
from attnserve.model.config import ModelConfig

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


@dataclass(frozen=True)
class Family:
    prefixes: tuple[str, ...]  # of the tensor names: a *ForCausalLM's first, the bare model's
    switches: Callable[[HFConfig], dict[str, Any]]  # ModelConfig fields from config.json
    weights: Callable[[Take, ModelConfig], Loads]  # -> the encoder's state_dict, lazily
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
