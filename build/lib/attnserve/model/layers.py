"""The building blocks of the encoder: attention layer, MLP, pre-LN block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.model.attention import scaled_dot_product_attention
from attnserve.model.config import ModelConfig


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with an output projection, causal by default.

    Q, K and V come from one fused Linear (one matmul instead of three, the
    GPT-2 layout); the heads are split out of it, attend independently, are
    concatenated and projected back to d_model. `causal=False` exists only to
    check the layer against the non-causal worked example of the attention texts.
    """

    def __init__(self, config: ModelConfig, causal: bool = True) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.causal = causal
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)

    def forward(
        self, x: torch.Tensor, need_weights: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T, D = x.shape
        H = self.n_heads
        q, k, v = self.qkv(x).split(D, dim=2)  # 3 x (B, T, D)
        q = q.view(B, T, H, D // H).transpose(1, 2)  # (B, H, T, d_k)
        k = k.view(B, T, H, D // H).transpose(1, 2)  # (B, H, T, d_k)
        v = v.view(B, T, H, D // H).transpose(1, 2)  # (B, H, T, d_k)
        if need_weights:
            y, weights = scaled_dot_product_attention(
                q, k, v, self.causal
            )  # (B,H,T,d_k), (B,H,T,T)
        else:
            # Same math through the fused kernel, which never materialises the
            # weights; it exports to ONNX's Attention op (opset 23).
            y, weights = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal), None
        y = y.transpose(1, 2).reshape(B, T, D)  # heads concatenated: (B, T, D)
        return self.proj(y), weights


class MLP(nn.Module):
    """Position-wise feed-forward: Linear(d, d_ff), GELU, Linear(d_ff, d)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.d_ff, bias=config.bias)
        # GPT-2 checkpoints were trained with the tanh approximation; match it exactly.
        self.act = nn.GELU(approximate="tanh" if config.activation == "gelu_tanh" else "none")
        self.proj = nn.Linear(config.d_ff, config.d_model, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.attn = MultiHeadAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, need_weights: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, weights = self.attn(self.ln1(x), need_weights)
        x = x + a
        x = x + self.mlp(self.ln2(x))
        return x, weights
