"""The families people study as tiny random checkpoints built by transformers, and their
exports by the real CLI: what tests/export's family tests (and the explorer's) compare."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_cli

# Awkward on purpose: odd head counts, 7:1 and 5:1 GQA, head_dim * heads != hidden size,
# partial rotary, sliding windows shorter than the test sequences, on some layers only.
FAMILY_SHAPES = {
    "llama": dict(
        hidden_size=56,
        intermediate_size=72,
        num_hidden_layers=2,
        num_attention_heads=7,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=96,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
    "mistral": dict(
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=12,
        max_position_embeddings=64,
        sliding_window=7,
    ),
    "qwen2": dict(
        hidden_size=40,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=5,
        num_key_value_heads=1,
        max_position_embeddings=64,
        use_sliding_window=True,
        sliding_window=6,
        max_window_layers=1,
    ),
    "gpt_neox": dict(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=3,
        max_position_embeddings=64,
        rotary_pct=0.25,
    ),
    "gemma": dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=20,
        max_position_embeddings=64,
    ),
    "phi3": dict(
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=3,
        max_position_embeddings=64,
        partial_rotary_factor=0.5,
        sliding_window=9,
    ),
    # The second round. Gemma 2: a soft-cap small enough to bend these scores, a scale
    # apart from head_dim, the window on layers 0 and 2.
    "gemma2": dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=12,
        max_position_embeddings=64,
        sliding_window=6,
        query_pre_attn_scalar=20,
        attn_logit_softcapping=0.2,
        final_logit_softcapping=30.0,
    ),
    # Gemma 3: a global layer between two local ones, linear rope scaling on it only.
    "gemma3_text": dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
        sliding_window=7,
        query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
    "qwen3": dict(
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=10,
        max_position_embeddings=64,
    ),
    "olmo2": dict(
        hidden_size=40,
        intermediate_size=56,
        num_hidden_layers=2,
        num_attention_heads=5,
        max_position_embeddings=64,
    ),
    # OLMo 3: three sliding layers and a global one with YaRN (from 16 positions to 64).
    "olmo3": dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=5,
        rope_parameters={
            "full_attention": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "rope_theta": 10000.0,
            },
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
    "phi": dict(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        partial_rotary_factor=0.5,
        qk_layernorm=True,
    ),
    "gpt2": dict(n_embd=48, n_head=4, n_layer=2, n_positions=64),
    "gptj": dict(n_embd=48, n_head=4, n_layer=2, rotary_dim=6, n_positions=64),
    "opt": dict(
        hidden_size=48,
        ffn_dim=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        word_embed_proj_dim=48,
    ),
    "stablelm": dict(
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=3,
        max_position_embeddings=64,
        partial_rotary_factor=0.25,
        qk_layernorm=True,
        use_qkv_bias=True,
    ),
    "granite": dict(
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=64,
        embedding_multiplier=12.0,
        attention_multiplier=0.2,
        residual_multiplier=0.3,
        logits_scaling=4.0,
    ),
}


class FamilyCheckpoints:
    """Each family's checkpoint (with its transformers reference) and its export by the real
    CLI, each made on first use and kept for the session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._checkpoints: dict[str, tuple[Path, object]] = {}
        self._exports: dict[str, Path] = {}

    def checkpoint(self, family: str) -> tuple[Path, object]:
        """(the saved directory, the transformers model it was saved from)."""
        from perf.hf_checkpoints import build_checkpoint

        if family not in self._checkpoints:
            directory = self.root / family
            reference = build_checkpoint(family, directory, **FAMILY_SHAPES[family])
            self._checkpoints[family] = directory, reference
        return self._checkpoints[family]

    def exported(self, family: str) -> Path:
        if family not in self._exports:
            directory, _ = self.checkpoint(family)
            out = self.root / f"{family}-model"
            result = run_cli("export", "--from-hf", str(directory), "--out", str(out))
            assert result.returncode == 0, result.stderr
            self._exports[family] = out
        return self._exports[family]
