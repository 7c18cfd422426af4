"""Attention as pictures: a heatmap with the tokens on both axes, and an entropy grid."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; no display needed
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("the heatmap needs matplotlib: pip install 'attnserve[viz]'") from exc
    return plt


def _save(fig, out: Path) -> Path:
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    fig.clf()
    return out


def render_heatmap(
    weights: np.ndarray,
    tokens: list[str],
    out: Path,
    title: str = "",
    row_tokens: list[str] | None = None,
) -> Path:
    """weights (R, T): row i = how query token i attends to tokens 0..i. `row_tokens` label
    the rows when they are not every token (the default). Writes a PNG."""
    plt = _pyplot()
    row_tokens = tokens if row_tokens is None else row_tokens
    t, r = len(tokens), len(row_tokens)
    width = min(4 + 0.28 * t, 40)  # keep labels readable as sequences grow
    height = min(2.5 + 0.28 * r, 40)
    fig, ax = plt.subplots(figsize=(width + 1.5, height))
    image = ax.imshow(
        weights, cmap="viridis", vmin=0.0, vmax=max(float(weights.max()), 1e-6), aspect="auto"
    )
    ax.set_xticks(range(t), labels=tokens, rotation=90, fontsize=9)
    ax.set_yticks(range(r), labels=row_tokens, fontsize=9)
    ax.set_xlabel("key (attended-to token)")
    ax.set_ylabel("query (attending token)")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    path = _save(fig, out)
    plt.close(fig)
    return path


def render_entropy_grid(
    entropy: np.ndarray, layers: list[int], heads: list[int], out: Path, title: str = ""
) -> Path:
    """entropy (L, H) in nats: low = a head that looks at few tokens (worth a heatmap)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(2 + 0.7 * len(heads), 1.5 + 0.6 * len(layers)))
    image = ax.imshow(entropy, cmap="magma", aspect="auto")
    ax.set_xticks(range(len(heads)), labels=[str(h) for h in heads])
    ax.set_yticks(range(len(layers)), labels=[str(layer) for layer in layers])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title)
    for i in range(len(layers)):
        for j in range(len(heads)):
            ax.text(j, i, f"{entropy[i, j]:.2f}", ha="center", va="center", color="w", fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="mean row entropy (nats)")
    path = _save(fig, out)
    plt.close(fig)
    return path
