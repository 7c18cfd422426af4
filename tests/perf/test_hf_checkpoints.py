"""The benchmarks' checkpoint builders: what they write is what an import reads."""

import torch

from attnserve.export.hf_import import read_hf
from perf.hf_checkpoints import build_streamed_checkpoint


def test_a_streamed_checkpoint_is_a_sharded_checkpoint_the_importer_takes(tmp_path):
    """Written shard by shard from transformers' own names and shapes: every tensor is
    mapped, the shapes agree with the config, and norms are near their identity."""
    data = {
        "model_type": "gemma2", "num_hidden_layers": 2, "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 512, "max_position_embeddings": 64,
    }  # fmt: skip
    parameters = build_streamed_checkpoint(data, tmp_path / "hf", shard_bytes=40_000)
    assert len(list((tmp_path / "hf").glob("model-*-of-*.safetensors"))) > 2
    checkpoint = read_hf(tmp_path / "hf", log=lambda _: None)  # refuses any unmapped tensor
    assert checkpoint.config.unembedding == "tied"
    tensors = dict(checkpoint.tensors)
    assert sum(t.numel() for t in tensors.values()) == parameters
    norm = tensors["blocks.0.ln1.weight"]  # Gemma's (1 + w): w near 0
    assert norm.dtype == torch.float32 and norm.abs().max() < 0.2
    assert tensors["tok_emb.weight"].std() > 0.01
