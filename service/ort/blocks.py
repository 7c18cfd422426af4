"""A long sequence's attention statistics, a block of query rows at a time.

The queries graph gives each layer's queries and keys (model/artifacts.py query_key_sites); for
each selected layer, `BlockStatistics` runs the graph of service/ort/block_graph.py over
blocks of the selected rows and puts the blocks' answers together: weights (whole rows, a
tile, or the top k), row entropy and received attention. A block holds at most
`block_bytes` of scores and what is made of them, so the rows per block shrink as the
text grows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from attnserve.model.config import ModelConfig
from attnserve.service.core.backend import AttentionOutput, AttentionSelection
from attnserve.service.core.budget import ATTENTION_BLOCK_BYTES
from attnserve.service.ort.block_graph import BlockRecipe, build_block_graph
from attnserve.service.ort.reducer import RecipeSessions

# A block's scores (H x rows x keys float32) and the few tensors made of them at once.
TENSORS_PER_BLOCK = 8


def block_rows(heads: int, keys: int, block_bytes: int = ATTENTION_BLOCK_BYTES) -> int:
    """How many query rows a block takes: its tensors of heads x rows x keys floats within
    `block_bytes` (one row at least)."""
    return max(1, block_bytes // (TENSORS_PER_BLOCK * 4 * heads * keys))


class BlockStatistics:
    """Runs selections over queries and keys; one ORT session per recipe, the latest kept."""

    def __init__(
        self,
        providers: list,
        session_options: ort.SessionOptions,
        config: ModelConfig,
        block_bytes: int = ATTENTION_BLOCK_BYTES,
        max_sessions: int = 16,
    ) -> None:
        self.config = config
        self.block_bytes = block_bytes
        self._sessions = RecipeSessions(build_block_graph, providers, session_options, max_sessions)

    def __call__(
        self,
        queries: Sequence[np.ndarray],
        keys: Sequence[np.ndarray],
        length: int,
        selection: AttentionSelection,
    ) -> AttentionOutput:
        """queries (Tm, H, dh) and keys (Tm, H_kv, dh) of each layer: one sequence's, of which
        the first `length` positions are its own -> what `selection` asks of them."""
        c, s = self.config, selection
        rows = np.arange(length) if s.rows is None else np.asarray(s.rows, dtype=np.int64)
        heads = np.asarray(s.heads, dtype=np.int64)
        every_head = len(heads) == c.n_heads and bool((heads == np.arange(c.n_heads)).all())
        recipe = BlockRecipe(
            scale=c.attention_scale or 1 / math.sqrt(c.head_dim),
            groups=c.n_heads // c.kv_heads if every_head else 0,
            softcap=c.attention_softcap,
            reduction=s.reduction,
            weights=s.weights and not s.top_k,
            top_k=s.top_k > 0,
            entropy=s.entropy or s.row_entropy,
            received=s.received,
        )
        session = self._sessions(recipe)
        names = [o.name for o in session.get_outputs()]
        start, end = s.key_range or (0, length)
        L, H, R = len(s.layers), len(heads), len(rows)
        reduced = 1 if s.reduction != "none" else H
        weights = np.zeros((L, reduced, R, end - start), np.float32) if recipe.weights else None
        values = np.zeros((L, reduced, R, s.top_k), np.float32) if s.top_k else None
        indices = np.full((L, reduced, R, s.top_k), -1, np.int32) if s.top_k else None
        entropy = np.zeros((L, H, R), np.float32) if recipe.entropy else None
        received = np.zeros((L, reduced, length), np.float32) if s.received else None
        step = block_rows(H, int(rows.max()) + 1, self.block_bytes)
        feeds = {
            "kv_heads": heads // (c.n_heads // c.kv_heads),
            "k": np.array([s.top_k], np.int64),
        }
        for i, layer in enumerate(s.layers):
            feeds["window"] = np.array([c.window(layer) or 0], np.int64)
            # (H_kv, T, dh) once per layer: each block reads a contiguous run of it
            feeds["keys"] = np.ascontiguousarray(keys[layer][:length].transpose(1, 0, 2))
            for first in range(0, R, step):
                block = rows[first : first + step]
                seen = int(block.max()) + 1  # the keys any row of the block sees
                feeds["queries"] = queries[layer][block][:, heads]  # (R', H', dh)
                feeds["rows"] = block
                feeds["key_range"] = np.array([start, min(end, seen)], np.int64)
                ran = session.run(names, {name: feeds[name] for name in recipe.inputs})
                out = dict(zip(names, ran, strict=True))
                part = slice(first, first + len(block))
                if weights is not None and seen > start:
                    weights[i, :, part, : min(end, seen) - start] = out["weights"]
                if values is not None and indices is not None:
                    k = out["values"].shape[-1]  # fewer than top_k where fewer keys
                    values[i, :, part, :k] = out["values"]
                    indices[i, :, part, :k] = out["indices"]
                if entropy is not None:
                    entropy[i, :, part] = out["entropy"]
                if received is not None:
                    received[i, :, :seen] += out["received"]
        kept = values if s.top_k else weights
        if kept is not None and s.float16:
            kept = kept.astype(np.float16)
        return AttentionOutput(
            rows,
            kept if s.weights else None,
            indices,
            entropy.mean(axis=2) if s.entropy and entropy is not None else None,
            row_entropy=entropy if s.row_entropy else None,
            received=received,
        )

    def close_sessions(self) -> None:
        self._sessions.clear()
