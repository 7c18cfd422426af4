"""The attention graphs in ORT directly, where the sequence's length is the subject: the
rollout's block-triangular products for lengths shorter than, equal to and past its blocks."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from attnserve.service.ort.reducer_graph import Recipe, build_graph
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


@pytest.mark.parametrize("reduction", ["mean", "max"])
@pytest.mark.parametrize("n_layers", [1, 2, 4])
@pytest.mark.parametrize("rows", [None, [0, 5, 10]])
def test_rollout_combines_heads_and_layers_as_numpy_does(reduction, n_layers, rows):
    """The mean's scale is divided out once at the end, the max's rows every layer: both
    must still be the per-layer renormalised product, whatever the layers and rows."""
    t = 11
    full = causal_softmax(np.random.default_rng(n_layers), (n_layers, 3, t, t))
    recipe = Recipe(reduction=reduction, rollout_layers=n_layers, pick_rows=rows is not None)
    session = ort.InferenceSession(
        build_graph(recipe).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    feeds = {"attention": full}
    if rows is not None:
        feeds["rows"] = np.array(rows, dtype=np.int64)
    (got,) = session.run(["weights"], feeds)
    want = ref.rollout(full, range(n_layers), range(3), rows or range(t), reduction)
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, atol=1e-5)
