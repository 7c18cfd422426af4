"""The model's one source of truth: a torch-free, frozen, JSON-serialisable config.

The same JSON travels inside checkpoints (safetensors metadata) and inside the
exported ONNX file (metadata_props); the service reads it back from there, so
there is never a second copy to drift.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

TOKENIZER_KINDS = ("byte", "hf")  # hf: the model directory's tokenizer.json
ACTIVATIONS = ("gelu", "gelu_tanh")


class ConfigError(ValueError):
    """A model config that cannot describe a valid model; the message names the field."""


@dataclass(frozen=True)
class ModelConfig:
    n_layers: int = 4  # number of transformer blocks
    n_heads: int = 8  # attention heads per block; d_model must divide evenly among them
    d_model: int = 256  # width of the residual stream (embedding size)
    d_ff: int = 1024  # hidden width of each block's MLP (4 * d_model in GPT-2)
    max_seq_len: int = 1024  # longest sequence: size of the learned positional table
    vocab_size: int = 259  # token table rows: 256 bytes + <pad>, <bos>, <eos> for "byte"
    tokenizer: str = "byte"  # how text becomes ids: "byte", or "hf" (tokenizer.json beside)
    pad_id: int = 256  # right-padding id; causality makes its value irrelevant to real tokens
    bos_id: int = 257  # prepended to text so the first real token has a context to attend from
    eos_id: int = 258  # appended to text on request (useful for "last" pooling)
    activation: str = "gelu"  # MLP nonlinearity: "gelu" (erf) or "gelu_tanh" (GPT-2's)
    layer_norm_eps: float = 1e-5  # LayerNorm epsilon
    bias: bool = True  # biases in Linear layers (GPT-2 has them)
    name: str = "attnserve-encoder"  # model name reported by the service
    input_name: str = "input_ids"  # ONNX input: int64 [batch, seq]
    embeddings_name: str = "embeddings"  # ONNX output: float32 [batch, seq, d_model]
    attentions_name: str = "attentions"  # ONNX output: float32 [batch, layers, heads, seq, seq]

    def __post_init__(self) -> None:
        for field in ("n_layers", "n_heads", "d_model", "d_ff", "max_seq_len", "vocab_size"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{field} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        for field in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, field)
            if not isinstance(value, int) or not 0 <= value < self.vocab_size:
                raise ConfigError(
                    f"{field} must be an integer in [0, vocab_size={self.vocab_size}), "
                    f"got {value!r}"
                )
        if self.tokenizer not in TOKENIZER_KINDS:
            raise ConfigError(f"tokenizer must be one of {TOKENIZER_KINDS}, got {self.tokenizer!r}")
        if self.tokenizer == "byte" and self.vocab_size < 256:
            raise ConfigError(
                f"vocab_size must be >= 256 for the byte tokenizer, got {self.vocab_size}"
            )
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if not isinstance(self.layer_norm_eps, float) or self.layer_norm_eps <= 0:
            raise ConfigError(
                f"layer_norm_eps must be a positive float, got {self.layer_norm_eps!r}"
            )
        names = (self.input_name, self.embeddings_name, self.attentions_name)
        if len(set(names)) != 3 or not all(isinstance(n, str) and n for n in names):
            raise ConfigError(f"input/output names must be distinct non-empty strings, got {names}")

    @property
    def head_dim(self) -> int:
        """d_k: the width of one head's queries, keys and values."""
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"model config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown model config field(s): {', '.join(unknown)}")
        # JSON has one number type; accept 1 where a float such as 1e-5 is expected.
        if isinstance(data.get("layer_norm_eps"), int):
            data = {**data, "layer_norm_eps": float(data["layer_norm_eps"])}
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"model config is not valid JSON: {exc}") from exc
        return cls.from_dict(data)
