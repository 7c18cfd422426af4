"""The checkpoints interpretability work centres on, by the sizes their config.json gives,
and what the import plan (model/footprint.py `plan_import`) gives each on machines of a
few sizes: docs/model.md's table, which tests/export/test_studied.py holds to this code.

Only the fields that size a model are written here; config_from_hf reads them as an import
would.
"""

from __future__ import annotations

from typing import Any

from attnserve.export.hf_import import config_from_hf
from attnserve.model.footprint import FootprintError, GiB, parameter_count, plan_import

_GPT2 = {"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024}
_PYTHIA = {
    "model_type": "gpt_neox", "vocab_size": 50304, "max_position_embeddings": 2048,
    "rotary_pct": 0.25, "use_parallel_residual": True, "tie_word_embeddings": False,
}  # fmt: skip
_GEMMA2 = {
    "model_type": "gemma2", "vocab_size": 256000, "head_dim": 256, "sliding_window": 4096,
    "max_position_embeddings": 8192, "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256,
    "hidden_activation": "gelu_pytorch_tanh",
}  # fmt: skip
_LLAMA3_ROPE = {
    "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}  # fmt: skip
STUDIED: dict[str, dict[str, Any]] = {
    "gpt2": _GPT2 | {"n_layer": 12, "n_embd": 768, "n_head": 12},
    "gpt2-xl": _GPT2 | {"n_layer": 48, "n_embd": 1600, "n_head": 25},
    "pythia-70m": _PYTHIA | {"num_hidden_layers": 6, "hidden_size": 512,
                             "num_attention_heads": 8, "intermediate_size": 2048},
    "pythia-410m": _PYTHIA | {"num_hidden_layers": 24, "hidden_size": 1024,
                              "num_attention_heads": 16, "intermediate_size": 4096},
    "pythia-1.4b": _PYTHIA | {"num_hidden_layers": 24, "hidden_size": 2048,
                              "num_attention_heads": 16, "intermediate_size": 8192},
    "pythia-2.8b": _PYTHIA | {"num_hidden_layers": 32, "hidden_size": 2560,
                              "num_attention_heads": 32, "intermediate_size": 10240},
    "Qwen2.5-0.5B": {"model_type": "qwen2", "num_hidden_layers": 24, "hidden_size": 896,
                     "num_attention_heads": 14, "num_key_value_heads": 2,
                     "intermediate_size": 4864, "vocab_size": 151936,
                     "max_position_embeddings": 32768, "tie_word_embeddings": True,
                     "rope_theta": 1000000.0},
    "TinyLlama-1.1B": {"model_type": "llama", "num_hidden_layers": 22, "hidden_size": 2048,
                       "num_attention_heads": 32, "num_key_value_heads": 4,
                       "intermediate_size": 5632, "vocab_size": 32000,
                       "max_position_embeddings": 2048, "tie_word_embeddings": False},
    "Llama-3.2-1B": {"model_type": "llama", "num_hidden_layers": 16, "hidden_size": 2048,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                     "intermediate_size": 8192, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "tie_word_embeddings": True,
                     "rope_theta": 500000.0, "rope_scaling": _LLAMA3_ROPE},
    "gemma-2-2b": _GEMMA2 | {"num_hidden_layers": 26, "hidden_size": 2304,
                             "num_attention_heads": 8, "num_key_value_heads": 4,
                             "intermediate_size": 9216},
    "gpt-j-6b": {"model_type": "gptj", "n_layer": 28, "n_embd": 4096, "n_head": 16,
                 "rotary_dim": 64, "vocab_size": 50400, "n_positions": 2048,
                 "tie_word_embeddings": False},
    "Mistral-7B-v0.1": {"model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096,
                        "num_attention_heads": 32, "num_key_value_heads": 8,
                        "intermediate_size": 14336, "vocab_size": 32000,
                        "max_position_embeddings": 32768, "sliding_window": 4096,
                        "tie_word_embeddings": False},
    "Qwen2.5-7B": {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
                   "num_attention_heads": 28, "num_key_value_heads": 4,
                   "intermediate_size": 18944, "vocab_size": 152064,
                   "max_position_embeddings": 131072, "tie_word_embeddings": False,
                   "rope_theta": 1000000.0},
    "Llama-3.1-8B": {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
                     "num_attention_heads": 32, "num_key_value_heads": 8,
                     "intermediate_size": 14336, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "tie_word_embeddings": False,
                     "rope_theta": 500000.0, "rope_scaling": _LLAMA3_ROPE | {"factor": 8.0}},
    "Qwen3-8B": {"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                 "intermediate_size": 12288, "vocab_size": 151936,
                 "max_position_embeddings": 40960, "tie_word_embeddings": False,
                 "rope_theta": 1000000.0},
    "gemma-2-9b": _GEMMA2 | {"num_hidden_layers": 42, "hidden_size": 3584,
                             "num_attention_heads": 16, "num_key_value_heads": 8,
                             "intermediate_size": 14336},
}  # fmt: skip
MACHINES_GIB = (16, 24, 32, 64)
# What a machine's OS and the rest of it keep: the plan is asked with the machine's memory
# less this (this 24 GiB machine has 23 GiB available).
RESERVED_BYTES = GiB


def checkpoint_plan(name: str, machine_gib: int) -> str:
    """What an import of the studied checkpoint `name` gets on a machine of `machine_gib`:
    "float32", "int8" (only int8 fits) or "refused"."""
    config = config_from_hf(STUDIED[name], name)
    available = machine_gib * GiB - RESERVED_BYTES
    try:
        return "float32" if plan_import(config, ("fp32",), available) else "int8"
    except FootprintError:
        try:
            plan_import(config, ("int8",), available)
        except FootprintError:
            return "refused"
        return "int8"


def plan_table() -> str:
    """docs/model.md's table: each studied checkpoint's parameters and plan per machine."""
    head = " | ".join(f"{gib} GiB" for gib in MACHINES_GIB)
    lines = [
        f"| checkpoint | parameters | {head} |",
        "|---|---|" + "---|" * len(MACHINES_GIB),
    ]
    for name, data in STUDIED.items():
        parameters = parameter_count(config_from_hf(data, name)) / 1e9
        plans = " | ".join(checkpoint_plan(name, gib) for gib in MACHINES_GIB)
        lines.append(f"| {name} | {parameters:.2f}B | {plans} |")
    return "\n".join(lines)
