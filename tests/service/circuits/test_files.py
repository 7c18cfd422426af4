"""What every API answers of a graph (service/circuits/files.py answer): the unpruned graph
only where its JSON fits the server's messages, else a refusal naming include_adjacency and
both sizes; the rest of the answer (circuit-tracer's file, field for field) is held to
circuit-tracer's own in test_attribute.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnserve.service.circuits.attribute import Attribution
from attnserve.service.circuits.files import VOCAB_BLOCK, answer, check_top_logits, feature_logits
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


class Decoders:
    """The two matrices feature_logits reads of a replacement model, as arrays."""

    def __init__(self, W_dec: np.ndarray, unembedding: np.ndarray) -> None:
        self.W_dec, self.W_U = W_dec, unembedding

    def decoder(self, layer: int) -> np.ndarray:
        return self.W_dec

    def unembedding(self) -> np.ndarray:
        return self.W_U


def test_a_features_top_logits_over_a_vocabulary_of_several_blocks():
    """The top tokens by blocks of the vocabulary are those of the whole (n, V) product,
    ties to the lower id; a vocabulary of 2.5 blocks, ties across a block's edge."""
    done = small_graph()
    rng = np.random.default_rng(1)
    V, D = int(VOCAB_BLOCK * 2.5), 6
    unembedding = rng.normal(size=(V, D)).astype(np.float32)
    unembedding[7] *= 10  # far the longest row
    unembedding[VOCAB_BLOCK + 3] = unembedding[7]  # a tie, in two blocks
    W_dec = rng.normal(size=(4, D)).astype(np.float32)
    W_dec[3] = unembedding[7]  # feature 3 raises token 7 (and its twin) most
    model = Decoders(W_dec, unembedding)
    got = feature_logits(model, done.graph, done.pruned.node_mask, 5, decode, logit_scale=2.0)
    want = 2.0 * (W_dec[3] @ unembedding.T)
    top = np.argsort(-want, kind="stable")[:5]
    assert top[0] == 7 and top[1] == VOCAB_BLOCK + 3
    assert [t["token"] for t in got["1_3-0"]] == [decode([int(t)]) for t in top]
    np.testing.assert_allclose([t["logit"] for t in got["1_3-0"]], want[top], rtol=1e-5)
    assert list(got) == ["1_3-0"]  # the graph's one feature: layer 1's feature 3
    with pytest.raises(InvalidInputError, match="top_logits: must be from 0 to 32, not 33"):
        check_top_logits(33)
