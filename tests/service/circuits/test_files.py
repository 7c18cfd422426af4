"""What every API answers of a graph (service/circuits/files.py answer): the unpruned graph
only where its JSON fits the server's messages, else a refusal naming include_adjacency and
both sizes; the rest of the answer (circuit-tracer's file, field for field) is held to
circuit-tracer's own in test_attribute.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnserve.service.circuits.attribute import Attribution
from attnserve.service.circuits.files import answer
from attnserve.service.circuits.graph import AttributionGraph, GraphOptions
from attnserve.service.circuits.influence import prune, scores
from attnserve.service.core.errors import InvalidInputError


def small_graph() -> Attribution:
    """Two layers, two tokens, one feature at (1, 1), one logit: a lower-triangular
    adjacency of random effects over its 1 + 2 * 2 + 2 + 1 = 8 nodes."""
    rng = np.random.default_rng(0)
    n = 8
    adjacency = np.tril(rng.normal(size=(n, n)), -1).astype(np.float32)
    adjacency[:, -1] = 0  # nothing reads the logit
    graph = AttributionGraph(
        input_tokens=np.array([1, 7]),
        logit_targets=np.array([5]),
        logit_probabilities=np.array([0.9], np.float32),
        active_features=np.array([[1, 1, 3]]),
        activation_values=np.array([2.0], np.float32),
        selected_features=np.array([0]),
        adjacency_matrix=adjacency,
        n_layers=2,
    )
    options = GraphOptions(node_threshold=1.0, edge_threshold=1.0)
    return Attribution(graph, prune(graph, 1.0, 1.0), scores(graph), "scan", options)


def decode(ids: list[int]) -> str:
    return "".join(f"<{i}>" for i in ids)


def test_the_unpruned_graph_comes_where_it_fits_and_is_refused_by_name_where_not():
    done = small_graph()
    whole = answer(done, decode, "graph", include_adjacency=True, max_bytes=2**20)
    assert np.array_equal(
        np.array(whole["adjacency"]["adjacency_matrix"], np.float32),
        done.graph.adjacency_matrix,
    )
    size = len(json.dumps(whole["adjacency"]["adjacency_matrix"]))
    with pytest.raises(InvalidInputError) as refused:
        answer(done, decode, "graph", include_adjacency=True, max_bytes=size // 4)
    assert refused.value.field == "include_adjacency"
    assert "the unpruned graph of 8 nodes" in str(refused.value)
    assert "adjacency" not in answer(done, decode, "graph", max_bytes=size // 4)
