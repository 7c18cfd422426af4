"""Each kept feature's top logits (service/circuits/top_logits.py), computed by blocks of
features and of the vocabulary as steps of the graph's job: those of the whole (n, V)
product, ties to the lower id; and how every API answers them (feature_logits by jsNodeId,
only the pruned graph's features). Against the real decoder and unembedding, numpy's own
product: test_attribute.py."""

from __future__ import annotations

import numpy as np
import pytest

from attnserve.service.circuits.files import answer
from attnserve.service.circuits.graph import AttributionGraph
from attnserve.service.circuits.top_logits import ROWS, VOCAB_BLOCK, check_top_logits, top_logits
from attnserve.service.core.errors import InvalidInputError
from tests.service.circuits.test_files import decode, small_graph


class Decoders:
    """The two matrices top_logits reads of a replacement model, as arrays."""

    def __init__(self, W_dec: np.ndarray, unembedding: np.ndarray) -> None:
        self.W_dec, self.W_U = W_dec, unembedding

    def decoder(self, layer: int) -> np.ndarray:
        return self.W_dec

    def unembedding(self) -> np.ndarray:
        return self.W_U


def run(job):
    """Every step of a job, then what it returns: (steps, result)."""
    steps = 0
    while True:
        try:
            next(job)
            steps += 1
        except StopIteration as end:
            return steps, end.value


def test_the_top_logits_by_blocks_are_the_whole_products():
    """More features than a block's rows on one layer, a vocabulary of 2.5 blocks, a tie
    across a block's edge."""
    S, V, D, k = ROWS + 6, int(VOCAB_BLOCK * 2.5), 6, 5
    rng = np.random.default_rng(1)
    unembedding = rng.normal(size=(V, D)).astype(np.float32)
    unembedding[7] *= 10  # far the longest row
    unembedding[VOCAB_BLOCK + 3] = unembedding[7]  # a tie, in two blocks
    W_dec = rng.normal(size=(S, D)).astype(np.float32)
    W_dec[3] = unembedding[7]  # feature 3 raises token 7 (and its twin) most
    n = S + 2 * 2 + 2 + 1  # features, errors, tokens, a logit
    graph = AttributionGraph(
        input_tokens=np.array([1, 7]),
        logit_targets=np.array([5]),
        logit_probabilities=np.array([0.9], np.float32),
        active_features=np.array([[1, 1, f] for f in range(S)]),
        activation_values=np.ones(S, np.float32),
        selected_features=np.arange(S),
        adjacency_matrix=np.zeros((n, n), np.float32),
        n_layers=2,
    )
    kept = np.ones(n, bool)
    kept[S - 1] = False  # a feature pruned: not asked
    steps, got = run(top_logits(Decoders(W_dec, unembedding), graph, kept, k, logit_scale=2.0))
    assert steps == 2 * 3  # two blocks of rows by three of the vocabulary
    want = 2.0 * (W_dec @ unembedding.T)
    assert sorted(got) == sorted(f"1_{f}-0" for f in range(S - 1))
    for feature in range(S - 1):
        tokens, values = got[f"1_{feature}-0"]
        top = np.argsort(-want[feature], kind="stable")[:k]
        np.testing.assert_array_equal(tokens, top)
        np.testing.assert_allclose(values, want[feature, top], rtol=1e-5)
    assert list(got["1_3-0"][0][:2]) == [7, VOCAB_BLOCK + 3]


def test_every_api_answers_the_pruned_graphs_features_top_logits():
    done = small_graph()
    W_dec = np.zeros((4, 3), np.float32)
    W_dec[3] = [1, 0, 0]
    unembedding = np.array([[0, 1, 0], [2, 0, 0], [1, 0, 0], [-1, 0, 0]], np.float32)
    _, found = run(top_logits(Decoders(W_dec, unembedding), done.graph, done.pruned.node_mask, 2))
    made = answer(done._replace(top_logits=found), decode, "graph")
    assert made["feature_logits"] == {
        "1_3-0": [{"token": "<1>", "logit": 2.0}, {"token": "<2>", "logit": 1.0}]
    }
    assert "feature_logits" not in answer(done, decode, "graph")
    with pytest.raises(InvalidInputError, match="top_logits: must be from 0 to 32, not 33"):
        check_top_logits(33)
