"""circuit-tracer 0.5.0's attribute() (attribution/attribute.py, context_nnsight.py,
targets.py) on a replacement model served by ONNX Runtime.

With the prompt's attention patterns, norm scales and MLP outputs frozen, the model is
linear from the embeddings to the logits, so a target node's row of direct effects is one
backward pass: its input direction put at its place (a logit's, its unembedding row less
the mean row, after the final norm; a feature's, its encoder column, at its transcoder's
input), then, where the gradient arrives, its inner product with what each source writes
(a feature's activation times its decoder row and an error's vector at that layer's MLP
output; a token's embedding at hook_embed). The logits' rows come first, then the
features' rows: every feature in order, or (max_feature_nodes) those of most influence on
the logits through the rows computed so far, re-ranked every update_interval batches.

Position 0's features and errors are zero, as circuit-tracer's (the first position is
an outlier every model has; the caller puts a special token there).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple

import numpy as np

from attnserve.service.circuits.graph import AttributionGraph, GraphOptions
from attnserve.service.circuits.influence import Pruned, partial_influences, prune, scores
from attnserve.service.circuits.plan import GraphPlan
from attnserve.service.circuits.top_logits import TopLogits, top_logits
from attnserve.service.core.replacement import ReplacementModel


@dataclass(frozen=True, eq=False)
class Sources:
    """What the prompt's run gives every node that writes: the active features (sorted by
    layer, position, feature), each one's encoder column and activation-scaled decoder
    row, each layer and position's error, each token's embedding."""

    features: np.ndarray  # int64 (F, 3): layer, position, feature
    activations: np.ndarray  # float32 (F,)
    encoders: np.ndarray  # float32 (F, d_in): what a feature's row puts at its input site
    decoders: np.ndarray  # float32 (F, D): activation x decoder row
    errors: np.ndarray  # float32 (L, T, D): each MLP's output less its reconstruction
    embeddings: np.ndarray  # float32 (T, D)
    blocks: list[tuple[int, int, int, int]]  # (layer, position, start, end) of features


def sources(model: ReplacementModel, input_ids: np.ndarray) -> tuple[Sources, np.ndarray]:
    """The prompt's sources and its next-token logits (V,)."""
    frozen = model.freeze(input_ids)
    L = len(frozen.outputs)
    features, values, encoders, decoders = [], [], [], []
    errors = frozen.outputs - frozen.skips
    for layer in range(L):
        acts = model.activations(layer, frozen.inputs[layer])  # (T, S)
        acts[0] = 0  # position 0: no features (and no error, below)
        positions, ids = np.nonzero(acts)  # sorted by position, then feature
        scaled = acts[positions, ids][:, None] * model.decoder(layer)[ids]  # (F_l, D)
        np.add.at(errors[layer], positions, -scaled)
        errors[layer] -= model.decoder_bias(layer)
        features.append(np.stack([np.full_like(ids, layer), positions, ids], axis=1))
        values.append(acts[positions, ids])
        encoders.append(np.ascontiguousarray(model.encoder(layer)[:, ids].T))
        decoders.append(scaled)
    errors[:, 0] = 0
    found = np.concatenate(features).astype(np.int64)
    blocks, start = [], 0
    for (layer, position), count in _runs(found[:, :2]):
        blocks.append((layer, position, start, start + count))
        start += count
    return Sources(
        found,
        np.concatenate(values).astype(np.float32),
        np.concatenate(encoders),
        np.concatenate(decoders).astype(np.float32),
        errors.astype(np.float32),
        frozen.embeddings,
        blocks,
    ), frozen.logits


def _runs(keys: np.ndarray) -> list[tuple[tuple[int, int], int]]:
    """Consecutive equal rows of keys (F, 2), as ((layer, position), count)."""
    if len(keys) == 0:
        return []
    starts = np.flatnonzero(np.any(keys[1:] != keys[:-1], axis=1)) + 1
    bounds = [0, *starts.tolist(), len(keys)]
    return [((int(keys[a, 0]), int(keys[a, 1])), b - a) for a, b in pairwise(bounds)]


def logit_targets(
    logits: np.ndarray, unembedding: np.ndarray, scale: float, options: GraphOptions
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The most likely tokens until their probabilities reach desired_logit_prob (at most
    max_n_logits): their ids, probabilities and directions (K, D), each one's unembedding
    row less the mean row (what the logit minus the mean logit reads)."""
    shifted = np.exp(logits - logits.max(), dtype=np.float32)
    probabilities = shifted / shifted.sum()
    top = np.argsort(-probabilities, kind="stable")[: options.max_n_logits]
    cumulative = np.cumsum(probabilities[top], dtype=np.float32)
    cutoff = int(np.searchsorted(cumulative, options.desired_logit_prob)) + 1
    ids = top[:cutoff]
    mean = unembedding.mean(axis=0, dtype=np.float32)
    directions = (np.asarray(unembedding[ids], np.float32) - mean) * np.float32(scale)
    return ids.astype(np.int64), probabilities[ids], directions


class Rows:
    """Backward passes of the prompt, `chunk` rows at most at once (the memory budget's):
    each row's direct effects on every feature, error and token, (n, F + (L + 1) T)."""

    def __init__(
        self, model: ReplacementModel, input_ids: np.ndarray, found: Sources, chunk: int
    ) -> None:
        self._model, self._ids, self._sources, self._chunk = model, input_ids, found, chunk

    def __call__(
        self, layers: np.ndarray, positions: np.ndarray, directions: np.ndarray
    ) -> np.ndarray:
        parts = []
        for start in range(0, len(layers), self._chunk):
            part = slice(start, start + self._chunk)
            parts.append(self._effects(layers[part], positions[part], directions[part]))
        return np.concatenate(parts)

    def _effects(
        self, layers: np.ndarray, positions: np.ndarray, directions: np.ndarray
    ) -> np.ndarray:
        found = self._sources
        mlp, embed = self._model.rows(self._ids, directions, layers, positions)
        F, (L, T, _) = len(found.features), found.errors.shape
        effects = np.empty((len(layers), F + (L + 1) * T), np.float32)
        for layer, position, start, end in found.blocks:  # (n, D) @ (D, features there)
            effects[:, start:end] = mlp[:, layer, position] @ found.decoders[start:end].T
        effects[:, F : F + L * T] = np.einsum("nltd,ltd->nlt", mlp, found.errors).reshape(
            len(layers), L * T
        )
        effects[:, F + L * T :] = np.einsum("ntd,td->nt", embed, found.embeddings)
        return effects


class Done(NamedTuple):
    """Where a graph is: backward rows computed of those it needs, and (its first step,
    before any row) what its matrices hold while it is made."""

    rows: int
    total: int
    held_bytes: int = 0


Steps = Generator[Done, None, AttributionGraph]


def attribute(
    model: ReplacementModel,
    input_ids: np.ndarray,
    options: GraphOptions,
    logit_scale: float = 1.0,
    max_rows: int | None = None,
) -> AttributionGraph:
    """The unpruned attribution graph of input_ids (T,) int64, computed at once (`steps`
    says what each argument means)."""
    run = steps(model, input_ids, options, logit_scale, max_rows)
    while True:
        try:
            next(run)
        except StopIteration as stop:
            graph: AttributionGraph = stop.value
            return graph


def steps(
    model: ReplacementModel,
    input_ids: np.ndarray,
    options: GraphOptions,
    logit_scale: float = 1.0,
    max_rows: int | None = None,
) -> Steps:
    """The unpruned attribution graph of input_ids (T,) int64 (its first token a special
    one: position 0 holds no features), one backward pass at a time: each step yields how
    far it is, the last returns the graph (so that whoever owns the model's cores runs it
    piece by piece, and stops it by closing it). `max_rows`: the most rows one backward
    pass may hold (the memory budget's; the visiting order is batch_size's whatever it is).
    `logit_scale`: what the model multiplies its logits by (Granite's)."""
    found, logits = sources(model, input_ids)
    targets, probabilities, directions = logit_targets(
        logits, model.unembedding(), logit_scale, options
    )
    F, (L, T, _) = len(found.features), found.errors.shape
    K, offset = len(targets), F + (L + 1) * T  # logit nodes start at offset
    n_visit = min(options.max_feature_nodes or F, F)
    batch = options.batch_size
    rows = Rows(model, input_ids, found, min(batch, max_rows or batch))
    total = K + n_visit
    # row r: the direct effects on node row_nodes[r] (its columns: every node but logits)
    edges = np.zeros((n_visit + K, offset + K), np.float32)
    row_nodes = np.zeros(n_visit + K, np.int64)
    # the rows, the square graph made of them, the sources' vectors
    held = 2 * edges.nbytes + found.encoders.nbytes + found.decoders.nbytes
    yield Done(0, total, held + found.errors.nbytes)
    for start in range(0, K, batch):
        part = slice(start, min(start + batch, K))
        n = part.stop - part.start
        edges[part, :offset] = rows(np.full(n, L), np.full(n, T - 1), directions[part])
        row_nodes[part] = offset + np.arange(part.start, part.stop)
        yield Done(part.stop, total)

    visited = np.zeros(F, bool)
    filled = K
    while filled - K < n_visit:
        if n_visit == F:
            pending = np.arange(F)
        else:
            ranked = partial_influences(edges[:filled], probabilities, row_nodes[:filled])
            order = np.argsort(-ranked[:F], kind="stable")
            queue = min(options.update_interval * batch, n_visit - (filled - K))
            pending = order[~visited[order]][:queue]
        for start in range(0, len(pending), batch):
            chosen = pending[start : start + batch]
            layer, position = found.features[chosen, 0], found.features[chosen, 1]
            end = filled + len(chosen)
            edges[filled:end, :offset] = rows(layer, position, found.encoders[chosen])
            row_nodes[filled:end] = chosen
            visited[chosen] = True
            filled = end
            yield Done(filled, total)
    return _packaged(found, input_ids, targets, probabilities, edges, row_nodes, visited, L)


def _packaged(
    found: Sources,
    input_ids: np.ndarray,
    targets: np.ndarray,
    probabilities: np.ndarray,
    edges: np.ndarray,
    row_nodes: np.ndarray,
    visited: np.ndarray,
    n_layers: int,
) -> AttributionGraph:
    """The rows in node order and the columns of the unvisited features dropped: a square
    matrix over the graph's nodes."""
    F, K = len(found.features), len(targets)
    selected = np.flatnonzero(visited)
    if len(selected) < F:
        edges = edges[:, np.concatenate([selected, np.arange(F, edges.shape[1])])]
    edges = edges[np.argsort(row_nodes, kind="stable")]
    n = edges.shape[1]
    adjacency = np.zeros((n, n), np.float32)
    adjacency[: len(selected)] = edges[: len(selected)]
    adjacency[n - K :] = edges[len(selected) :]
    return AttributionGraph(
        input_tokens=np.asarray(input_ids, np.int64),
        logit_targets=targets,
        logit_probabilities=probabilities.astype(np.float32),
        active_features=found.features,
        activation_values=found.activations,
        selected_features=selected.astype(np.int64),
        adjacency_matrix=adjacency,
        n_layers=n_layers,
    )


class Attribution(NamedTuple):
    """A graph, its pruning, its scores (replacement, completeness) and the transcoder
    set's identifier (circuit-tracer's scan)."""

    graph: AttributionGraph
    pruned: Pruned
    scores: tuple[float, float]
    scan: str
    options: GraphOptions
    top_logits: TopLogits | None = None  # the kept features' (circuits/top_logits.py)


def attribution(
    model: ReplacementModel, plan: GraphPlan, logit_scale: float = 1.0, k: int = 0
) -> Generator[Done | None, None, Attribution]:
    """A planned graph step by step (`steps`), pruned and scored at its last, then (k > 0)
    the k top logits of each feature it keeps, a step per block (yielding None)."""
    graph = yield from steps(model, plan.input_ids, plan.options, logit_scale, plan.max_rows)
    options = plan.options
    pruned = prune(graph, options.node_threshold, options.edge_threshold)
    found = None
    if k:
        found = yield from top_logits(model, graph, pruned.node_mask, k, logit_scale)
    return Attribution(graph, pruned, scores(graph), model.scan, options, found)
