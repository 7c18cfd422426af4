"""A checkpoint's tensors -> the encoder's state_dict, family by family (`<family>_weights`):
separate q/k/v and gate/up projections concatenated into the encoder's fused Linears, fused
layouts that interleave heads (GPT-NeoX) reordered, GPT-2's Conv1D weights transposed.

Each entry is a loader, not a tensor: it reads what it needs from the checkpoint when
called, so an import holds one of the encoder's tensors at a time, whatever the model's
size. A missing tensor is refused when the map is made, before anything is read.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from attnserve.export.hf_config import HFImportError
from attnserve.model.config import ModelConfig

Load = Callable[[], torch.Tensor]  # reads one tensor when called
Take = Callable[[str], Load]  # a checkpoint tensor's loader by its name without the prefix
Loads = dict[str, Load]  # the encoder's state_dict, one loader per tensor


def _then(load: Load, change: Callable[[torch.Tensor], torch.Tensor]) -> Load:
    return lambda: change(load())


def _cat(loads: list[Load]) -> Load:
    if len(loads) == 1:  # one tensor: itself, not a copy
        return loads[0]
    return lambda: torch.cat([load() for load in loads])


def _stack(loads: list[Load]) -> Load:
    return lambda: torch.stack([load() for load in loads])


def _rows(load: Load, start: int, stop: int) -> Load:
    return _then(load, lambda t: t[start:stop])


def gpt2_weights(take: Take, config: ModelConfig) -> Loads:
    def conv1d(name: str) -> Load:  # Conv1D keeps (in, out); Linear (out, in)
        return _then(take(name), lambda t: t.t().contiguous())

    out = {
        "tok_emb.weight": take("wte.weight"),
        "pos_emb.weight": _rows(take("wpe.weight"), 0, config.max_seq_len),  # --max-seq-len
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


def _optional(take: Take, name: str) -> Load | None:
    try:
        return take(name)
    except HFImportError:
        return None


def _linear(out: Loads, take: Take, ours: str, *theirs: str) -> None:
    """One encoder Linear from one or more HF Linears, concatenated along the outputs.
    Biases are taken where the checkpoint has them; the shape check catches a missing one."""
    out[f"{ours}.weight"] = _cat([take(f"{t}.weight") for t in theirs])
    biases = [_optional(take, f"{t}.bias") for t in theirs]
    if any(b is not None for b in biases):
        if any(b is None for b in biases):
            missing = [f"{t}.bias" for t, b in zip(theirs, biases, strict=True) if b is None]
            raise HFImportError(f"missing tensor {missing[0]}")
        out[f"{ours}.bias"] = _cat([b for b in biases if b is not None])


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


def _norm(out: Loads, take: Take, ours: str, theirs: str) -> None:
    """A norm's weight, and its bias where the checkpoint has one (LayerNorm)."""
    out[f"{ours}.weight"] = take(f"{theirs}.weight")
    if (bias := _optional(take, f"{theirs}.bias")) is not None:
        out[f"{ours}.bias"] = bias


def llama_weights(take: Take, config: ModelConfig, fused: bool = False) -> Loads:
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
                out[f"{ours}attn.{q_or_k}_norm.weight"] = _stack(per_head)
        elif config.qk_norm is not None:
            _norm(out, take, f"{ours}attn.q_norm", f"{attn}q_norm")
            _norm(out, take, f"{ours}attn.k_norm", f"{attn}k_norm")
    return out


def phi_weights(take: Take, config: ModelConfig) -> Loads:
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


def gptj_weights(take: Take, config: ModelConfig) -> Loads:
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


def opt_weights(take: Take, config: ModelConfig) -> Loads:
    start = OPT_POSITION_OFFSET
    out = {
        "tok_emb.weight": take("embed_tokens.weight"),
        "pos_emb.weight": _rows(take("embed_positions.weight"), start, start + config.max_seq_len),
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


def phi3_weights(take: Take, config: ModelConfig) -> Loads:
    return llama_weights(take, config, fused=True)


def neox_weights(take: Take, config: ModelConfig) -> Loads:
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
            if (fused := out.get(f"{ours}attn.qkv.{p}")) is not None:
                out[f"{ours}attn.qkv.{p}"] = _then(fused, lambda t: _heads_first(t, config))
        _linear(out, take, f"{ours}attn.proj", f"{theirs}attention.dense")
        _linear(out, take, f"{ours}mlp.fc", f"{theirs}mlp.dense_h_to_4h")
        _linear(out, take, f"{ours}mlp.proj", f"{theirs}mlp.dense_4h_to_h")
    return out


def _heads_first(t: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """NeoX's fused (H, 3, d_k, ...) rows as (3, H, d_k, ...): q | k | v."""
    per_head = t.reshape(config.n_heads, 3, config.head_dim, *t.shape[1:])
    return per_head.transpose(0, 1).reshape(t.shape)
