"""The attention options in plain numpy, from the full float32 weights: what the
server's ONNX graphs must equal."""

from __future__ import annotations

import numpy as np


def select(full: np.ndarray, layers, heads, rows) -> np.ndarray:
    """(L, H, T, T) -> (L', H', R, T)."""
    return full[np.ix_(list(layers), list(heads))][:, :, list(rows)]


def reduce_heads(weights: np.ndarray, reduction: str) -> np.ndarray:
    if reduction == "mean":
        return weights.mean(axis=1, keepdims=True)
    if reduction == "max":
        return weights.max(axis=1, keepdims=True)
    return weights


def rollout(full: np.ndarray, layers, heads, rows, reduction: str = "mean") -> np.ndarray:
    """(1, 1, R, T): heads combined, A' = 0.5 A + 0.5 I renormalised, A'_last ... A'_first."""
    t = full.shape[-1]
    result = np.eye(t)
    for layer in sorted(layers):
        a = reduce_heads(full[layer][list(heads)][None].astype(np.float64), reduction)[0, 0]
        a = 0.5 * a + 0.5 * np.eye(t)
        a /= a.sum(axis=-1, keepdims=True)
        result = a @ result
    return result[list(rows)][None, None]


def top_k(weights: np.ndarray, rows, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row the k largest weights among the row's causal keys (0..row), then -1 / 0."""
    *lead, r, _ = weights.shape
    values = np.zeros((*lead, r, k), dtype=weights.dtype)
    indices = np.full((*lead, r, k), -1, dtype=np.int32)
    for i, row in enumerate(rows):
        keys = weights[..., i, : row + 1]
        order = np.argsort(-keys, axis=-1, kind="stable")[..., :k]
        n = order.shape[-1]
        values[..., i, :n] = np.take_along_axis(keys, order, axis=-1)
        indices[..., i, :n] = order
    return values, indices


def head_entropy(full: np.ndarray, layers, heads, rows) -> np.ndarray:
    """(L', H'): mean over the rows of -sum p ln p."""
    p = select(full, layers, heads, rows).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(p), 0.0)
    return -terms.sum(axis=-1).mean(axis=-1)
