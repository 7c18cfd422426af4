"""The building blocks of the encoder: rotary positions, attention, MLP, the block (its norms:
model/norms.py).

Every class has the switches of the model families it reproduces (model/config.py);
with the default config each is GPT-2's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attnserve.model import hooks
from attnserve.model.attention import attention_weights, causal_mask
from attnserve.model.config import ModelConfig
from attnserve.model.hook_points import HookPoint
from attnserve.model.norms import EachHeadNorm, make_norm
from attnserve.model.rope import frequencies

# each of model/config.py's ACTIVATIONS
ACTIVATION_MODULES: dict[str, Callable[[], nn.Module]] = {
    "gelu": lambda: nn.GELU(approximate="none"),
    # GPT-2 (and Gemma) were trained with the tanh approximation; match it exactly.
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": nn.ReLU,
    "silu": nn.SiLU,
}


class Rotary(nn.Module):
    """Rotary position embeddings: cos and sin of position * frequency.

    The tables are computed once for max_seq_len positions the way transformers computes
    them (float32 inverse frequencies, scaled as the checkpoint says, position times
    frequency), so the exported graph only slices them; they are rebuilt from the config,
    never stored in a checkpoint. Their cos and sin are taken in float64 and rounded once:
    torch's float32 cos on two threads is now and then 1.5e-4 off in some processes
    (research/rope-tables), and the export builds the model again in a child process, so
    a graph's tables and its parity reference's must not depend on the process.
    """

    cos: torch.Tensor  # buffers, (max_seq_len, dims)
    sin: torch.Tensor

    def __init__(
        self, config: ModelConfig, theta: float | None = None, scaled: bool = True
    ) -> None:
        super().__init__()
        scaling = config.rope_scaling if scaled else None
        inv_freq, factor = frequencies(config.rotary_dims, theta or config.rope_theta, scaling)
        positions = torch.arange(config.max_seq_len, dtype=torch.float)
        freqs = positions[:, None] * inv_freq[None, :]  # (max_seq_len, dims / 2)
        if config.rotary_interleaved:  # GPT-J: each frequency on a pair of adjacent dims
            angles = freqs.repeat_interleave(2, dim=-1)
        else:  # half-split: the first half of the dims pairs with the second
            angles = torch.cat((freqs, freqs), dim=-1)  # (max_seq_len, dims)
        # YaRN and LongRoPE scale cos and sin (and so every attention score) by a factor.
        if angles.is_meta:  # a shape-only twin (tracing): the tables are made for real after
            cos, sin = torch.empty_like(angles), torch.empty_like(angles)
        else:
            exact = angles.numpy().astype(np.float64)
            cos, sin = (
                torch.from_numpy((f(exact) * factor).astype(np.float32)) for f in (np.cos, np.sin)
            )
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[:t], self.sin[:t]  # 2 x (T, dims)

    def at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables at each row's own positions (B, T): 2 x (B, 1, T, dims), broadcast
        over the heads (decoding: every text of a batch is at a length of its own)."""
        return self.cos[positions][:, None], self.sin[positions][:, None]


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


class KVCache:
    """One layer's keys and values of the positions decoded before, and which of them each
    new query may see: the decode graph's state (Encoder.decode). `extend` appends the new
    positions' keys and values (after the rotation, as transformers' cache holds them)."""

    def __init__(self, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor) -> None:
        self.key, self.value = key, value  # (B, H_kv, P, d_k) each
        self.mask = mask  # (B, 1, T, P + T) bool: True where query t may see key s

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.key = torch.cat((self.key, k), dim=2)  # (B, H_kv, P + T, d_k)
        self.value = torch.cat((self.value, v), dim=2)
        return self.key, self.value


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
        layer: int = 0,
    ) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.d_k = config.n_heads, config.kv_heads, config.head_dim
        self.causal, self.window = causal, window
        self.interleaved = config.rotary_interleaved
        self.scale = config.attention_scale  # None: 1 / sqrt(d_k)
        self.softcap = config.attention_softcap
        q_width, kv_width = self.n_heads * self.d_k, self.n_kv_heads * self.d_k
        self.widths = [q_width, kv_width, kv_width]
        qkv_bias = config.bias if config.qkv_bias is None else config.qkv_bias
        out_bias = config.bias if config.out_bias is None else config.out_bias
        self.qkv = nn.Linear(config.d_model, q_width + 2 * kv_width, bias=qkv_bias)
        self.proj = nn.Linear(q_width, config.d_model, bias=out_bias)
        self.qk_norm = config.qk_norm
        if config.qk_norm == "projection":  # over all heads' dims at once (OLMo 2)
            self.q_norm = make_norm(config, q_width)
            self.k_norm = make_norm(config, kv_width)
        elif config.qk_norm == "head":  # over head_dim, one weight for every head
            self.q_norm = make_norm(config, self.d_k)
            self.k_norm = make_norm(config, self.d_k)
        elif config.qk_norm == "each_head":
            eps = config.layer_norm_eps
            self.q_norm = EachHeadNorm(self.n_heads, self.d_k, eps)
            self.k_norm = EachHeadNorm(self.n_kv_heads, self.d_k, eps)
        self.hook_q = HookPoint(hooks.Q.format(layer=layer))
        self.hook_k = HookPoint(hooks.K.format(layer=layer))
        self.hook_v = HookPoint(hooks.V.format(layer=layer))
        self.hook_rot_q = HookPoint(hooks.ROT_Q.format(layer=layer))
        self.hook_rot_k = HookPoint(hooks.ROT_K.format(layer=layer))
        self.hook_pattern = HookPoint(hooks.PATTERN.format(layer=layer))
        self.hook_z = HookPoint(hooks.Z.format(layer=layer))

    def forward(
        self,
        x: torch.Tensor,
        need_weights: bool = True,
        positions: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, D) -> the output projection's (B, T, D), and the weights (B, H, T, T)
        where need_weights (else the fused kernel, which never materialises them).
        positions: rotary (cos, sin) of each position, or None (learned positions).
        cache: the keys and values before x's positions (decoding), extended by x's."""
        B, T, _ = x.shape
        H, H_kv, d_k = self.n_heads, self.n_kv_heads, self.d_k
        q, k, v = self.qkv(x).split(self.widths, dim=2)  # (B, T, H*d_k), 2 x (B, T, H_kv*d_k)
        if self.qk_norm == "projection":
            q, k = self.q_norm(q), self.k_norm(k)
        q = self.hook_q(q.view(B, T, H, d_k)).transpose(1, 2)  # (B, H, T, d_k)
        k = self.hook_k(k.view(B, T, H_kv, d_k)).transpose(1, 2)  # (B, H_kv, T, d_k)
        v = self.hook_v(v.view(B, T, H_kv, d_k)).transpose(1, 2)  # (B, H_kv, T, d_k)
        if self.qk_norm in ("head", "each_head"):  # per head, before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        if positions is not None:  # rotary: (cos, sin) of each position, through q and k only
            q = apply_rotary(q, *positions, self.interleaved)
            k = apply_rotary(k, *positions, self.interleaved)
        if self.hook_rot_q.active or self.hook_rot_k.active:  # read at (B, T, H, d_k)
            q = self.hook_rot_q(q.transpose(1, 2)).transpose(1, 2)
            k = self.hook_rot_k(k.transpose(1, 2)).transpose(1, 2)
        mask = None
        if cache is not None:  # the keys of every position so far: (B, H_kv, S, d_k)
            k, v = cache.extend(k, v)
            mask = cache.mask
        if (
            need_weights or self.softcap is not None or cache is not None
        ):  # the fused kernel has no soft-cap
            if H_kv != H:  # each K/V head repeated for the query heads that read it
                k = k.repeat_interleave(H // H_kv, dim=1)  # (B, H, T, d_k)
                v = v.repeat_interleave(H // H_kv, dim=1)  # (B, H, T, d_k)
            probabilities = self.hook_pattern(
                attention_weights(q, k, self.causal, self.window, self.scale, self.softcap, mask)
            )  # (B, H, T, S)
            y = probabilities @ v  # (B, H, T, d_k)
            weights = probabilities if need_weights else None
        else:
            # Same math through the fused kernel, which never materialises the
            # weights; it exports to ONNX's Attention op (opset 23), GQA included.
            mask = None
            if self.window is not None:
                mask = causal_mask(T, T, self.window, device=x.device)
            is_causal = self.causal and mask is None
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.scale, enable_gqa=H_kv != H
            )
            weights = None
        z = self.hook_z(y.transpose(1, 2))  # (B, T, H, d_k): each head's output
        return self.proj(z.reshape(B, T, H * d_k)), weights  # (B, T, D), (B, H, T, T)


class MLP(nn.Module):
    """Position-wise feed-forward: Linear(d, d_ff), activation, Linear(d_ff, d).

    Gated (SwiGLU, GeGLU): one Linear makes both the gate and the up projection,
    and the activation of the gate multiplies the other half.
    """

    def __init__(self, config: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        bias = config.bias if config.mlp_bias is None else config.mlp_bias
        self.gated = config.mlp == "gated"
        width = 2 * config.d_ff if self.gated else config.d_ff
        self.fc = nn.Linear(config.d_model, width, bias=bias)
        self.act = ACTIVATION_MODULES[config.activation]()
        self.proj = nn.Linear(config.d_ff, config.d_model, bias=bias)
        self.hook_in = HookPoint(hooks.MLP_IN.format(layer=layer))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(self.hook_in(x))  # (B, T, d_ff), or (B, T, 2 * d_ff) gated
        if self.gated:
            gate, up = h.chunk(2, dim=-1)  # 2 x (B, T, d_ff)
            return self.proj(self.act(gate) * up)
        return self.proj(self.act(h))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)).

    With the parallel residual (GPT-NeoX) both read the block's input:
    x + attn(ln1(x)) + mlp(ln2(x)); with one norm (GPT-J, Phi), x + attn(h) + mlp(h)
    for h = ln1(x). The other norm placements (config.NORM_PLACEMENTS): sandwich adds
    norms of each sublayer's output (ln1_out, ln2_out), output keeps only those, post
    norms the sum. Granite scales each sublayer's output before the add.

    Its sites (model/hooks.py): the stream it reads (hook_resid_pre), what each sublayer
    writes (hook_attn_out, hook_mlp_out: after their own output norms, before Granite's
    scale), the stream between them (hook_resid_mid, sequential blocks) and what it writes
    (hook_resid_post).
    """

    def __init__(self, config: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.residual, self.placement = config.residual, config.norm_placement
        self.scale = config.residual_scale

        def norm(name: str) -> nn.Module:
            return make_norm(config, name=name.format(layer=layer))

        if self.placement != "output":
            self.ln1 = norm(hooks.LN1)
        self.attn = MultiHeadAttention(config, window=config.window(layer), layer=layer)
        if self.placement != "output" and self.residual != "parallel_one_norm":
            self.ln2 = norm(hooks.LN2)
        self.mlp = MLP(config, layer)
        if self.placement in ("sandwich", "output"):  # TransformerLens' ln1_post, ln2_post
            self.ln1_out = norm(hooks.LN1_POST)
            self.ln2_out = norm(hooks.LN2_POST)
        self.hook_resid_pre = HookPoint(hooks.RESID_PRE.format(layer=layer))
        self.hook_attn_out = HookPoint(hooks.ATTN_OUT.format(layer=layer))
        if self.residual == "sequential":  # a parallel block has no stream between
            self.hook_resid_mid = HookPoint(hooks.RESID_MID.format(layer=layer))
        self.hook_mlp_out = HookPoint(hooks.MLP_OUT.format(layer=layer))
        self.hook_resid_post = HookPoint(hooks.RESID_POST.format(layer=layer))

    def forward(
        self,
        x: torch.Tensor,
        need_weights: bool = True,
        positions: tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, D) -> (B, T, D), and the attention weights (B, H, T, T) where asked;
        `cache`: this layer's keys and values before x (decoding)."""
        x = self.hook_resid_pre(x)

        def attn(h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
            return self.attn(h, need_weights, positions, cache)

        if self.residual != "sequential":
            h = self.ln1(x)
            a, weights = attn(h)
            m = self.mlp(h if self.residual == "parallel_one_norm" else self.ln2(x))
            a, m = self.hook_attn_out(a), self.hook_mlp_out(m)
            return self.hook_resid_post(x + self._scaled(a + m)), weights
        x, weights = self._sublayer(x, 1, attn)
        x, _ = self._sublayer(self.hook_resid_mid(x), 2, lambda h: (self.mlp(h), None))
        return self.hook_resid_post(x), weights

    def _sublayer(
        self,
        x: torch.Tensor,
        index: int,
        f: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x plus one sublayer's output (1: attention, 2: MLP), with the norms where this
        model has them."""
        out = self.hook_attn_out if index == 1 else self.hook_mlp_out
        if self.placement == "post":  # norm(x + f(x))
            y, weights = f(x)
            return getattr(self, f"ln{index}")(x + out(y)), weights
        y, weights = f(x if self.placement == "output" else getattr(self, f"ln{index}")(x))
        if self.placement in ("sandwich", "output"):
            y = getattr(self, f"ln{index}_out")(y)
        return x + self._scaled(out(y)), weights

    def _scaled(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.scale if self.scale != 1.0 else y
