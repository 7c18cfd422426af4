"""What a model costs in memory, from its config alone: known before a tensor is read.

An import holds one float32 copy of the weights plus what one layer and the parity
check need (export/model_dir.py), or for int8 where that does not fit, one tensor at a
time; a served model holds its weights once per ONNX
Runtime session (each session prepacks its own copy of the matrices), plus the answers
it is building, bounded by the memory budget. Torch-free: the service uses it too.
"""

from __future__ import annotations

import os
from pathlib import Path

from attnserve.model.config import ModelConfig

GiB = 1 << 30
# What the libraries themselves take beside the weights: torch, the exporter and ONNX
# Runtime for an import; ONNX Runtime, gRPC and the HTTP stack for a server (measured by
# `python -m perf sizes`, rounded up).
IMPORT_BASE_BYTES = int(1.5 * GiB)
SERVE_BASE_BYTES = GiB // 2
# An import's transient share beyond the one float32 copy: one layer's tensors being
# converted and written, the parity outputs (bounded by export/parity.py's longest case).
IMPORT_MARGIN = 0.15


class FootprintError(ValueError):
    """A model that would not fit in the memory there is; the message says by how much."""


def parameter_count(config: ModelConfig) -> int:
    """The encoder's parameters for this config (as Encoder(config) holds them)."""
    d, dh, h, kv = config.d_model, config.head_dim, config.n_heads, config.kv_heads
    qkv_bias = config.bias if config.qkv_bias is None else config.qkv_bias
    out_bias = config.bias if config.out_bias is None else config.out_bias
    mlp_bias = config.bias if config.mlp_bias is None else config.mlp_bias
    per_feature = 2 if config.norm == "layernorm" else 1  # weight, and LayerNorm's bias

    def norm(width: int = d) -> int:
        return per_feature * width

    width = (2 if config.mlp == "gated" else 1) * config.d_ff
    attention = d * (h + 2 * kv) * dh + qkv_bias * (h + 2 * kv) * dh + h * dh * d + out_bias * d
    attention += {
        None: 0,
        "head": 2 * norm(dh),
        "each_head": (h + kv) * dh,
        "projection": norm(h * dh) + norm(kv * dh),
    }[config.qk_norm]
    mlp = d * width + mlp_bias * width + config.d_ff * d + mlp_bias * d
    norms = {"pre": 2, "sandwich": 4, "output": 2, "post": 2}[config.norm_placement]
    if config.residual == "parallel_one_norm":
        norms -= 1
    table = config.vocab_size * config.embedding_dim
    table += config.max_seq_len * d if config.positions == "learned" else 0
    table += 2 * d * config.d_embed if config.d_embed is not None else 0
    final = norm() if config.norm_placement != "post" else 0
    if config.unembedding == "separate":  # else the token table unembeds too
        final += config.vocab_size * (config.embedding_dim + config.unembedding_bias)
    return table + config.n_layers * (norms * norm() + attention + mlp) + final


def weight_bytes(config: ModelConfig) -> int:
    """The float32 weights' bytes: on disk, and in memory once."""
    return 4 * parameter_count(config)


def import_bytes(config: ModelConfig) -> int:
    """The peak an import of this config is expected to reach."""
    return int(weight_bytes(config) * (1 + IMPORT_MARGIN)) + IMPORT_BASE_BYTES


def available_memory() -> int:
    """Bytes this process may still take: the smaller of the machine's available memory and
    what its cgroup (a container's limit) leaves."""
    available = _meminfo("MemAvailable")
    limit = _read_int(Path("/sys/fs/cgroup/memory.max"))
    used = _read_int(Path("/sys/fs/cgroup/memory.current"))
    if limit is not None and used is not None:
        available = min(available, max(limit - used, 0))
    return available


def largest_tensor_bytes(config: ModelConfig) -> int:
    """The float32 bytes of the encoder's largest tensor: the token table (and an
    unembedding of its size), a layer's fused q/k/v or MLP input matrix."""
    width = (2 if config.mlp == "gated" else 1) * config.d_ff
    qkv = (config.n_heads + 2 * config.kv_heads) * config.head_dim
    positions = config.max_seq_len if config.positions == "learned" else 0
    rows = max(config.vocab_size, width, qkv, positions)
    return 4 * rows * max(config.d_model, config.embedding_dim)


# What a streamed import holds of one tensor at its largest: read, widened, transposed
# (the way MatMul reads it), then read back from the float32 file and quantized.
STREAMED_COPIES = 3


def streamed_import_bytes(config: ModelConfig) -> int:
    """The peak of an int8 import that reads the checkpoint one tensor at a time: the
    larger of its parity check (an import of the float32 model's first PREFIX_LAYERS
    layers) and its largest tensor's copies, whatever the model's depth."""
    streaming = IMPORT_BASE_BYTES + STREAMED_COPIES * largest_tensor_bytes(config)
    return max(import_bytes(prefix_config(config)), streaming)


# Where the float32 model does not fit, int8's parity gate runs on its first layers.
PREFIX_LAYERS = 2


def prefix_config(config: ModelConfig) -> ModelConfig:
    """The model cut after its first PREFIX_LAYERS layers (its final norm kept)."""
    import dataclasses

    layers = min(PREFIX_LAYERS, config.n_layers)
    sliding = config.sliding_layers
    if sliding is not None:
        sliding = tuple(i for i in sliding if i < layers) or None
    window = config.sliding_window if sliding is not None or config.sliding_layers is None else None
    return dataclasses.replace(
        config, n_layers=layers, sliding_layers=sliding, sliding_window=window
    )


def plan_import(
    config: ModelConfig,
    precisions: tuple[str, ...] = ("fp32",),
    available: int | None = None,
) -> bool:
    """Whether an import of `config` holds the float32 model (True) or, for int8 alone where
    float32 does not fit, streams the checkpoint one tensor at a time (False). Raises
    FootprintError, with the numbers, where neither fits `available` bytes (default:
    available_memory())."""
    available = available_memory() if available is None else available
    need = import_bytes(config)
    if need <= available:
        return True
    streamed = streamed_import_bytes(config)
    if precisions == ("int8",) and streamed <= available:
        return False
    hint = "free memory, or import on a machine with more"
    if precisions != ("int8",) and streamed <= available:
        hint = f"--precision int8 alone imports it in about {streamed / GiB:.1f} GiB"
    raise FootprintError(
        f"importing {config.name} needs about {need / GiB:.1f} GiB "
        f"({parameter_count(config) / 1e9:.2f}B parameters: {weight_bytes(config) / GiB:.1f} "
        f"GiB of float32 weights, plus {IMPORT_BASE_BYTES / GiB:.1f} GiB for the libraries) "
        f"and {available / GiB:.1f} GiB is available; {hint}"
    )


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):  # absent, or "max": no limit
        return None
