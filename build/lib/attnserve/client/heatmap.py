"""Render one layer/head of attention as a heatmap with the tokens on both axes."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def render_heatmap(weights: np.ndarray, tokens: list[str], out: Path, title: str = "") -> Path:
    """weights (T, T): row i = how token i attends to tokens 0..i. Writes a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; no display needed
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("the heatmap needs matplotlib: pip install 'attnserve[viz]'") from exc
    t = len(tokens)
    size = min(4 + 0.28 * t, 40)  # keep labels readable as sequences grow
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=max(float(weights.max()), 1e-6))
    ax.set_xticks(range(t), labels=tokens, rotation=90, fontsize=9)
    ax.set_yticks(range(t), labels=tokens, fontsize=9)
    ax.set_xlabel("key (attended-to token)")
    ax.set_ylabel("query (attending token)")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
