"""The building blocks of the encoder: norms, rotary positions, attention, MLP, the block.

Every class has the switches of the model families it reproduces (model/config.py);
with the default config each is GPT-2's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.model.attention import causal_mask, scaled_dot_product_attention
from attnserve.model.config import ModelConfig

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": lambda: nn.GELU(approximate="none"),
    # GPT-2 (and Gemma) were trained with the tanh approximation; match it exactly.
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": nn.ReLU,
    "silu": nn.SiLU,
}


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w (Llama); Gemma stores w - 1 and scales by (1 + w)."""

    def __init__(self, dim: int, eps: float, plus_one: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.offset = 1.0 if plus_one else 0.0
        self.weight = nn.Parameter(torch.zeros(dim) if plus_one else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * (self.offset + self.weight)


def make_norm(config: ModelConfig) -> nn.Module:
    if config.norm == "layernorm":
        return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
    return RMSNorm(
        config.d_model, config.layer_norm_eps, plus_one=config.norm == "rmsnorm_plus_one"
    )


class Rotary(nn.Module):
    """Rotary position embeddings: cos and sin of position * frequency for every layer.

    The tables are computed once for max_seq_len positions the way transformers computes
    them (float32 inverse frequencies, position times frequency), so the exported graph
    only slices them; they are rebuilt from the config, never stored in a checkpoint.
    """

    cos: torch.Tensor  # buffers, (max_seq_len, dims)
    sin: torch.Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        dims = config.rotary_dims
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dims, 2, dtype=torch.float) / dims))
        positions = torch.arange(config.max_seq_len, dtype=torch.float)
        freqs = positions[:, None] * inv_freq[None, :]  # (max_seq_len, dims / 2)
        if config.rotary_interleaved:  # GPT-J: each frequency on a pair of adjacent dims
            angles = freqs.repeat_interleave(2, dim=-1)
        else:  # half-split: the first half of the dims pairs with the second
            angles = torch.cat((freqs, freqs), dim=-1)  # (max_seq_len, dims)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[:t], self.sin[:t]  # 2 x (T, dims)


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False
) -> torch.Tensor:
    """x (B, H, T, d_k) with its first cos.size(-1) dims rotated by position; the rest pass."""
    dims = cos.size(-1)
    x_rot, x_pass = x[..., :dims], x[..., dims:]
    if interleaved:  # (x0, x1) -> (-x1, x0) on each adjacent pair
        turned = torch.stack((-x_rot[..., 1::2], x_rot[..., ::2]), dim=-1).flatten(-2)
    else:  # (a, b) -> (-b, a) on the two halves
        a, b = x_rot.chunk(2, dim=-1)
        turned = torch.cat((-b, a), dim=-1)
    return torch.cat((x_rot * cos + turned * sin, x_pass), dim=-1)


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention with an output projection, causal by default.

    Q, K and V come from one fused Linear (one matmul instead of three, the
    GPT-2 layout). With grouped-query attention (n_kv_heads < n_heads) K and V
    have fewer heads, each read by n_heads / n_kv_heads consecutive query heads,
    so the weights are still reported per query head. `causal=False` exists only
    to check the layer against the non-causal worked example of the attention texts.
    """

    def __init__(
        self,
        config: ModelConfig,
        causal: bool = True,
        window: int | None = None,
    ) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_k = config.n_heads, config.kv_heads, config.head_dim
        self.causal, self.window = causal, window
        self.interleaved = config.rotary_interleaved
        q_width, kv_width = self.n_heads * self.d_k, self.n_kv_heads * self.d_k
        self.widths = [q_width, kv_width, kv_width]
        qkv_bias = config.bias if config.qkv_bias is None else config.qkv_bias
        out_bias = config.bias if config.out_bias is None else config.out_bias
        self.qkv = nn.Linear(config.d_model, q_width + 2 * kv_width, bias=qkv_bias)
        self.proj = nn.Linear(q_width, config.d_model, bias=out_bias)

    def forward(
        self,
        x: torch.Tensor,
        need_weights: bool = True,
        positions: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, T, _ = x.shape
        H, H_kv, d_k = self.n_heads, self.n_kv_heads, self.d_k
        q, k, v = self.qkv(x).split(self.widths, dim=2)  # (B, T, H*d_k), 2 x (B, T, H_kv*d_k)
        q = q.view(B, T, H, d_k).transpose(1, 2)  # (B, H, T, d_k)
        k = k.view(B, T, H_kv, d_k).transpose(1, 2)  # (B, H_kv, T, d_k)
        v = v.view(B, T, H_kv, d_k).transpose(1, 2)  # (B, H_kv, T, d_k)
        if positions is not None:  # rotary: (cos, sin) of each position, through q and k only
            q = apply_rotary(q, *positions, self.interleaved)
            k = apply_rotary(k, *positions, self.interleaved)
        if need_weights:
            if H_kv != H:  # each K/V head repeated for the query heads that read it
                k = k.repeat_interleave(H // H_kv, dim=1)  # (B, H, T, d_k)
                v = v.repeat_interleave(H // H_kv, dim=1)  # (B, H, T, d_k)
            y, weights = scaled_dot_product_attention(q, k, v, self.causal, self.window)
        else:
            # Same math through the fused kernel, which never materialises the
            # weights; it exports to ONNX's Attention op (opset 23), GQA included.
            mask = None
            if self.window is not None:
                mask = causal_mask(T, T, self.window, device=x.device)
            is_causal = self.causal and mask is None
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=H_kv != H
            )
            weights = None
        y = y.transpose(1, 2).reshape(B, T, H * d_k)  # heads concatenated: (B, T, H*d_k)
        return self.proj(y), weights  # (B, T, D), (B, H, T, T)


class MLP(nn.Module):
    """Position-wise feed-forward: Linear(d, d_ff), activation, Linear(d_ff, d).

    Gated (SwiGLU, GeGLU): one Linear makes both the gate and the up projection,
    and the activation of the gate multiplies the other half.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        bias = config.bias if config.mlp_bias is None else config.mlp_bias
        self.gated = config.mlp == "gated"
        width = 2 * config.d_ff if self.gated else config.d_ff
        self.fc = nn.Linear(config.d_model, width, bias=bias)
        self.act = ACTIVATIONS[config.activation]()
        self.proj = nn.Linear(config.d_ff, config.d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)  # (B, T, d_ff), or (B, T, 2 * d_ff) gated
        if self.gated:
            gate, up = h.chunk(2, dim=-1)  # 2 x (B, T, d_ff)
            return self.proj(self.act(gate) * up)
        return self.proj(self.act(h))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)).

    With the parallel residual (GPT-NeoX) both read the block's input:
    x + attn(ln1(x)) + mlp(ln2(x)).
    """

    def __init__(self, config: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.parallel = config.residual == "parallel"
        self.ln1 = make_norm(config)
        self.attn = MultiHeadAttention(config, window=config.window(layer))
        self.ln2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        need_weights: bool = True,
        positions: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, weights = self.attn(self.ln1(x), need_weights, positions)
        if self.parallel:
            return x + a + self.mlp(self.ln2(x)), weights
        x = x + a
        x = x + self.mlp(self.ln2(x))
        return x, weights
