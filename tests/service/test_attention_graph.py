"""The attention graphs in ORT directly, where the sequence's length is the subject: the
rollout's block-triangular products for lengths shorter than, equal to and past its blocks."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from attnserve.service.attention_graph import Recipe, build_graph
from tests.service import attention_reference as ref


def causal_softmax(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random (..., T, T) rows that sum to 1 over their causal keys, like a model's."""
    t = shape[-1]
    scores = np.where(np.tril(np.ones((t, t), bool)), rng.normal(size=shape), -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def rollout_session():
    graph = build_graph(Recipe(reduction="mean", rollout_layers=3)).SerializeToString()
    return ort.InferenceSession(graph, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("t", [1, 2, 3, 4, 5, 9, 64, 101])
def test_rollout_of_every_row_equals_the_dense_product(rollout_session, t):
    full = causal_softmax(np.random.default_rng(t), (3, 2, t, t))
    (got,) = rollout_session.run(["weights"], {"attention": full})
    want = ref.rollout(full, range(3), range(2), range(t))
    assert got.shape == (1, 1, t, t)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert (got[0, 0][np.triu_indices(t, 1)] == 0).all()
