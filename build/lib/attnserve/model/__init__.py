"""The causal self-attention encoder.

Only the torch-free parts are imported here (config, tokenizer), so the serving
path can `import model` without torch. The PyTorch modules live in
`model.attention`, `model.layers`, `model.encoder` and `model.checkpoint`.
"""

from attnserve.model.config import ConfigError, ModelConfig
from attnserve.model.tokenizer import ByteTokenizer, HFTokenizer, get_tokenizer

__all__ = ["ByteTokenizer", "ConfigError", "HFTokenizer", "ModelConfig", "get_tokenizer"]
