"""The tokens each feature of a pruned graph raises most (the explorer's hover,
`feature_logits`): its decoder row straight through the unembedding, the final norm left
out, as Neuronpedia's top logits are. A step of the graph's job per block of rows and of the
vocabulary, so the engine runs other work between them and a step holds a bounded matrix
whatever the graph's and the vocabulary's sizes.
"""

from __future__ import annotations

from collections.abc import Generator

import numpy as np

from attnserve.service.circuits.graph import AttributionGraph
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.replacement import ReplacementModel

MAX_TOP_LOGITS = 32  # a feature's top tokens an answer lists at most
# A step's block: ROWS features x VOCAB_BLOCK tokens of logits, 8 MiB of float32 (about 6x
# that with its sort), within the room the graph's backward passes hold
ROWS, VOCAB_BLOCK = 64, 32_768
# each feature's top tokens and their logits (k,) by circuit-tracer's jsNodeId of it
TopLogits = dict[str, tuple[np.ndarray, np.ndarray]]


def check_top_logits(k: int) -> None:
    if not 0 <= k <= MAX_TOP_LOGITS:
        raise InvalidInputError(f"top_logits: must be from 0 to {MAX_TOP_LOGITS}, not {k}")


def top_logits(
    model: ReplacementModel,
    graph: AttributionGraph,
    kept: np.ndarray,
    k: int,
    logit_scale: float = 1.0,
) -> Generator[None, None, TopLogits]:
    """The k tokens each kept feature's decoder row raises most (ties to the lower id), by
    jsNodeId, which names a layer's feature at every position; yields after each block."""
    wanted: dict[int, set[int]] = {}
    for index in np.flatnonzero(kept[: graph.n_features]).tolist():
        _, layer, _, feature = graph.node(index)
        wanted.setdefault(layer, set()).add(feature)
    unembedding = model.unembedding()  # (V, D)
    made: TopLogits = {}
    for layer, features in sorted(wanted.items()):
        ids = sorted(features)
        for first in range(0, len(ids), ROWS):
            chunk = ids[first : first + ROWS]
            rows = model.decoder(layer)[chunk]  # (n, D)
            best = np.empty((len(chunk), 0), np.float32)
            best_ids = np.empty((len(chunk), 0), np.int64)
            for start in range(0, len(unembedding), VOCAB_BLOCK):
                block = logit_scale * (rows @ unembedding[start : start + VOCAB_BLOCK].T)  # (n, b)
                block_ids = np.broadcast_to(np.arange(start, start + block.shape[1]), block.shape)
                values = np.concatenate([best, block], axis=1)
                order = np.argsort(-values, axis=1, kind="stable")[:, :k]  # ties: the lower id
                best = np.take_along_axis(values, order, axis=1)
                best_ids = np.take_along_axis(np.concatenate([best_ids, block_ids], 1), order, 1)
                yield
            for feature, values, tokens in zip(chunk, best, best_ids, strict=True):
                made[f"{layer}_{feature}-0"] = tokens, values
    return made
