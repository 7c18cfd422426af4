"""Random-weight Hugging Face checkpoints of the families attnserve imports, built offline.

No hub is reachable here, so every checkpoint is made from a config by transformers
itself (`from_config`, eager attention, `save_pretrained`) with a byte-level BPE
tokenizer trained on the spot. The tests use tiny, awkward shapes; the families and sizes
benchmarks use real models' shapes (their config.json's sizes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Attention is all you need!",
    "café crème brûlée, naïve façade",
    "emoji 🤖🚀 and more",
    "  whitespace   runs\n\tand tabs  ",
]
SPECIALS = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2 of every tokenizer trained here

# Real models' shapes (random weights): the sizes of their config.json.
SMOLLM2_135M = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    vocab_size=49152,
)
PYTHIA_160M = dict(
    hidden_size=768,
    intermediate_size=3072,
    num_hidden_layers=12,
    num_attention_heads=12,
    max_position_embeddings=2048,
    rotary_pct=0.25,
    use_parallel_residual=True,
    vocab_size=50304,
)
QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    vocab_size=151936,
)

TINYLLAMA_11B = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    vocab_size=32000,
)
PYTHIA_14B = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=24,
    num_attention_heads=16,
    max_position_embeddings=2048,
    rotary_pct=0.25,
    use_parallel_residual=True,
    vocab_size=50304,
)
MISTRAL_7B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    vocab_size=32000,
    sliding_window=None,
)

# The second round's families (perf/families.py, second_round)
GEMMA2_2B = dict(
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=26,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    max_position_embeddings=8192,
    sliding_window=4096,
    query_pre_attn_scalar=256,
    attn_logit_softcapping=50.0,
    final_logit_softcapping=30.0,
    rms_norm_eps=1e-6,
    vocab_size=256000,
)
LLAMA32_1B = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=64,
    max_position_embeddings=131072,
    rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    vocab_size=128256,
)
QWEN3_06B = dict(
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    vocab_size=151936,
)
GEMMA3_1B = dict(
    hidden_size=1152,
    intermediate_size=6912,
    num_hidden_layers=26,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    max_position_embeddings=32768,
    sliding_window=512,
    query_pre_attn_scalar=256,
    rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    },
    rms_norm_eps=1e-6,
    vocab_size=262144,
)


def train_tokenizer(vocab_size: int):
    """A byte-level BPE with <pad>, <s>, </s> as ids 0, 1, 2, trained on TEXTS in a second."""
    from tokenizers import ByteLevelBPETokenizer

    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        TEXTS * 20, vocab_size=vocab_size, min_frequency=1, special_tokens=SPECIALS
    )
    return tokenizer


def build_checkpoint(
    model_type: str,
    directory: Path,
    seed: int = 0,
    perturb: float = 0.05,
    max_shard_size: str | None = None,
    dtype: Any = None,
    **fields: Any,
):
    """Save a random `model_type` causal LM with these config fields (and a tokenizer) to
    `directory`; return the transformers model (eager attention, eval mode), the reference.

    `perturb` adds noise of that size to every parameter: transformers initialises biases
    to 0 and norm weights to 1 (or 0), where a weight mapped to the wrong place would go
    unnoticed. `dtype` (e.g. torch.bfloat16, as published checkpoints are): the weights
    saved in it; the returned model is then in it too.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = train_tokenizer(min(fields.get("vocab_size", 400), 400))
    fields = {"vocab_size": tokenizer.get_vocab_size(), **fields}
    config = AutoConfig.for_model(
        model_type, pad_token_id=0, bos_token_id=1, eos_token_id=2, **fields
    )
    torch.manual_seed(seed)
    # Made in `dtype` from the start: a 7B model made in float32 first would take 28 GB.
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=dtype or torch.float32
    ).eval()
    if perturb:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * perturb)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    tokenizer.save(str(directory / "tokenizer.json"))
    return model


def reference_outputs(model, ids):
    """transformers' last hidden state (B, T, D) and attention probabilities (B, L, H, T, T)."""
    import torch

    with torch.no_grad():
        out = model.base_model(torch.as_tensor(ids), output_attentions=True)
    return out.last_hidden_state.numpy(), torch.stack(out.attentions, dim=1).numpy()


def build_streamed_checkpoint(
    data: dict[str, Any], directory: Path, std: float = 0.02, shard_bytes: int = 2 << 30
) -> int:
    """A random bfloat16 checkpoint of the config.json fields `data` (model_type included),
    written shard by shard without ever holding the model: an 8-9B model made whole would
    not leave room for its import beside it. Names and shapes come from transformers' model
    on the meta device; norms' weights are their identity (1, or 0 where Gemma adds 1) plus
    noise of `std`, every other tensor normal of `std`. Returns the parameter count."""
    import json

    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in data.items() if k != "model_type"}
    config = AutoConfig.for_model(
        data["model_type"], pad_token_id=0, bos_token_id=1, eos_token_id=2, **fields
    )
    with torch.device("meta"):
        shapes = {
            k: v.shape for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()
        }
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    identity = 0.0 if data["model_type"].startswith("gemma") else 1.0
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        if size >= shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += 2 * shape.numel()
    directory.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name in names:
            values = torch.randn(shapes[name]) * std
            if name.endswith("norm.weight"):
                values += identity
            tensors[name] = values.to(torch.bfloat16)
        save_file(tensors, str(directory / file), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(names, file)
        del tensors
    index = {"metadata": {"total_size": 2 * sum(s.numel() for s in shapes.values())}}
    index["weight_map"] = weight_map
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.save_pretrained(directory)
    train_tokenizer(400).save(str(directory / "tokenizer.json"))
    return sum(s.numel() for s in shapes.values())
