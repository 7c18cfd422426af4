"""Scaled dot-product attention, the textbook way, returning its weights.

We compute the weights explicitly (instead of calling a fused kernel) because
returning them is the point of this server: callers study attention maps.
"""

from __future__ import annotations

import math

import torch


def causal_mask(
    t_q: int, t_k: int, window: int | None = None, device: torch.device | None = None
) -> torch.Tensor:
    """(t_q, t_k) bool, True where query i may look at key j: j <= i, and with a sliding
    window also j > i - window (the query and the window - 1 keys before it, Mistral's rule)."""
    mask = torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril()
    if window is not None:
        mask = mask.triu(1 - window)
    return mask


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    causal: bool = True,
    window: int | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_k)) over the last two axes: q (..., T, d_k), k (..., S, d_k)
    -> weights (..., T, S).

    mask (..., T, S) bool, True where a query may see a key, replaces the causal mask
    (decoding: each row's past keys, some of them padding, then the new ones).
    scale replaces 1 / sqrt(d_k) (Gemma 2's query_pre_attn_scalar, Granite's multiplier);
    softcap bounds the scores smoothly to (-cap, cap) before the mask: cap * tanh(s / cap).
    Each row sums to 1, and with causal=True entries with j > i (and, given a window,
    j <= i - window) are exactly 0 because their scores are -inf before the softmax
    (exp(-inf) == 0, not "small").
    """
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    # Scale q rather than the scores: T*d_k multiplies instead of T*S.
    scores = (q * scale) @ k.transpose(-2, -1)  # (..., T, S)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif causal:
        mask = causal_mask(scores.size(-2), scores.size(-1), window, device=scores.device)
        scores = scores.masked_fill(~mask, float("-inf"))
    # Every row keeps its diagonal, so no row is all -inf and softmax never gives NaN.
    return torch.softmax(scores, dim=-1)  # (..., T, S)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    window: int | None = None,
    scale: float | None = None,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights of `attention_weights` and what they make of v (..., S, d_v): output
    (..., T, d_v) and weights (..., T, S)."""
    weights = attention_weights(q, k, causal, window, scale, softcap)
    return weights @ v, weights
