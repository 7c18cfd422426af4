"""How much each node of an attribution graph matters to its logits, and the pruning and
scores built on it: circuit-tracer 0.5.0's graph.py (normalize_matrix, compute_influence,
find_threshold, prune_graph, compute_graph_scores, compute_partial_influences), in float32
as it computes them.

Influence is the logits' weights pushed back through the graph's normalized |edges| until
nothing is left (the graph has no cycles: a node's sources lie below it), so a node's
influence sums its direct and indirect effects on the logits, each path's share of its
target's inputs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from attnserve.service.circuits.graph import AttributionGraph

MAX_ITERATIONS = 1000  # a graph's depth is its layers + 2; more means a cycle


def normalized(matrix: np.ndarray, floor: float = 1e-10) -> np.ndarray:
    """|matrix| with each row (a target's inputs) summing to 1."""
    absolute = np.abs(matrix)
    return absolute / np.maximum(absolute.sum(axis=1, keepdims=True), np.float32(floor))


def influence(A: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """weights @ (A + A^2 + ...), summed until a power is all zeros."""
    current = weights @ A
    total = current.copy()
    for _ in range(MAX_ITERATIONS):
        if not current.any():
            return total
        current = current @ A
        total += current
    raise RuntimeError(f"the graph's influence did not converge in {MAX_ITERATIONS} steps")


def threshold(scores: np.ndarray, fraction: float) -> np.float32:
    """The score above which the largest scores hold `fraction` of their sum."""
    ranked = np.sort(scores)[::-1]
    # a running sum in float64, as torch's on a CPU accumulates float32
    cumulative = (np.cumsum(ranked, dtype=np.float64).astype(np.float32)) / ranked.sum()
    index = min(int(np.searchsorted(cumulative, fraction)), len(cumulative) - 1)
    return ranked[index]


class Pruned(NamedTuple):
    node_mask: np.ndarray  # bool (N,): the nodes kept
    edge_mask: np.ndarray  # bool (N, N): the edges kept (target rows, source columns)
    cumulative_scores: np.ndarray  # float32 (N,): each node's place in the influence ranking


def logit_weights(graph: AttributionGraph) -> np.ndarray:
    """(N,) the logit targets' probabilities on their nodes (the last), zeros elsewhere."""
    weights = np.zeros(len(graph.adjacency_matrix), np.float32)
    weights[-len(graph.logit_targets) :] = graph.logit_probabilities
    return weights


def prune(graph: AttributionGraph, node_threshold: float, edge_threshold: float) -> Pruned:
    """The nodes holding `node_threshold` of the influence (tokens and logits always), then
    the edges holding `edge_threshold` of what is left, then the features and errors left
    with no edge out (or, features, none in), until none is."""
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be between 0 and 1, not {value}")
    A = graph.adjacency_matrix
    n_kept = len(graph.logit_targets) + len(graph.input_tokens)  # tokens and logits: last
    n_features = len(graph.selected_features)
    weights = logit_weights(graph)
    node_influence = influence(normalized(A), weights)
    nodes = node_influence >= threshold(node_influence, node_threshold)
    nodes[-n_kept:] = True
    kept = np.where(nodes[:, None] & nodes[None, :], A, np.float32(0))
    scored = normalized(kept)
    edge_scores = scored * (influence(scored, weights) + weights)[:, None]
    edges = edge_scores >= threshold(edge_scores.ravel(), edge_threshold)
    while True:
        before = nodes.copy()
        nodes[:-n_kept] &= edges[:, :-n_kept].any(0)  # something out
        nodes[:n_features] &= edges[:n_features].any(1)  # a feature: something in
        if np.array_equal(nodes, before):
            break
        edges[~nodes] = False
        edges[:, ~nodes] = False
    order = np.argsort(-node_influence, kind="stable")
    ranked = node_influence[order]
    cumulative = np.empty_like(node_influence)
    cumulative[order] = np.cumsum(ranked, dtype=np.float64).astype(np.float32) / ranked.sum()
    return Pruned(nodes, edges, cumulative)


def scores(graph: AttributionGraph) -> tuple[float, float]:
    """(replacement, completeness): the tokens' share of the influence the tokens and the
    errors have on the logits; and the influence-weighted share of every node's inputs
    that is not an error's."""
    n_features, T = len(graph.selected_features), len(graph.input_tokens)
    errors = slice(n_features, n_features + T * graph.n_layers)
    tokens = slice(errors.stop, errors.stop + T)
    weights = logit_weights(graph)
    A = normalized(graph.adjacency_matrix)
    node_influence = influence(A, weights)
    token_influence, error_influence = node_influence[tokens].sum(), node_influence[errors].sum()
    replacement = token_influence / (token_influence + error_influence)
    not_errors = 1 - A[:, errors].sum(axis=-1)
    output = node_influence + weights
    completeness = (not_errors * output).sum() / output.sum()
    return float(replacement), float(completeness)


def partial_influences(
    edges: np.ndarray, probabilities: np.ndarray, row_nodes: np.ndarray, max_iter: int = 128
) -> np.ndarray:
    """Each node's influence on the logits through the rows computed so far (edges
    (R, N), row r the inputs of node row_nodes[r]): what orders the features still to
    visit."""
    A = np.abs(edges)
    A /= np.maximum(A.sum(axis=1, keepdims=True), np.float32(1e-8))
    total = np.zeros(edges.shape[1], np.float32)
    product = np.zeros(edges.shape[1], np.float32)
    product[-len(probabilities) :] = probabilities
    for _ in range(max_iter):
        product = product[row_nodes] @ A
        if not product.any():
            return total
        total += product
    raise RuntimeError(f"the partial influences did not converge in {max_iter} steps")
