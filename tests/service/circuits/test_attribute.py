"""Attribution graphs (service/circuits) against circuit-tracer 0.5.0's, on the same tiny
random checkpoints and transcoder sets, in float32 on the CPU: Llama with GQA and Gemma 2
(sandwich norms, soft-caps, tied embeddings scaled by sqrt(d)), layer 0's MLP writing an
outlier dimension in the thousands and transcoders scaled to the values they read and write
(perf/circuit_tracer_peer.py builds them with circuit-tracer's own transformers, and runs
its attribute(), prune_graph() and compute_graph_scores()). Every active feature visited in
order, and the influence-ordered visit of a few (max_feature_nodes), with other knobs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from attnserve.export.transcoder_set import add_transcoder_set
from attnserve.service.circuits.attribute import attribute
from attnserve.service.circuits.graph import GraphOptions
from attnserve.service.circuits.influence import prune, scores
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from perf.peer_env import CIRCUIT_TRACER
from tests.conftest import run_cli

IDS = [1, 40, 17, 250, 99, 3, 77, 180, 64, 12]  # <s> first: circuit-tracer prepends nothing
INFLUENCE_ORDERED = dict(max_feature_nodes=150, batch_size=32, max_n_logits=4)
KNOBS = ({}, {**INFLUENCE_ORDERED, "node_threshold": 0.6, "edge_threshold": 0.9})
TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=["llama", "gemma2"])
def case(request, circuit_tracer_python, tmp_path_factory):
    """(the served replacement model, the folder circuit-tracer reads) of one family."""
    folder = tmp_path_factory.mktemp(request.param)
    subprocess.run(
        [str(circuit_tracer_python), str(CIRCUIT_TRACER.script), "build",
         "--family", request.param, "--out", str(folder)],
        check=True,
    )  # fmt: skip
    model_dir = folder / "attnserve"
    result = run_cli("export", "--from-hf", str(folder / "model"), "--out", str(model_dir))
    assert result.returncode == 0, result.stderr
    add_transcoder_set(model_dir, folder / "transcoders", name="plt", log=lambda _: None)
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    return runtime.replacement("plt"), folder, circuit_tracer_python


def circuit_tracer(python: Path, folder: Path, knobs: dict, out: Path):
    subprocess.run(
        [str(python), str(CIRCUIT_TRACER.script), "attribute", str(folder),
         "--ids", ",".join(map(str, IDS)), "--out", str(out), "--knobs", json.dumps(knobs)],
        check=True,
    )  # fmt: skip
    return np.load(out)


@pytest.mark.parametrize("knobs", KNOBS, ids=["defaults", "influence-ordered"])
def test_the_graph_is_circuit_tracers(case, knobs, tmp_path):
    replacement, folder, python = case
    want = circuit_tracer(python, folder, knobs, tmp_path / "graph.npz")
    options = GraphOptions(**knobs)
    # a backward pass of 7 rows at most: the memory budget's chunks do not change the graph
    graph = attribute(replacement, np.array(IDS), options, max_rows=7)

    np.testing.assert_array_equal(graph.logit_targets, want["logit_targets"])
    np.testing.assert_allclose(graph.logit_probabilities, want["logit_probabilities"], atol=1e-6)
    np.testing.assert_array_equal(graph.active_features, want["active_features"])
    scale = np.abs(want["activation_values"]).max()
    np.testing.assert_allclose(
        graph.activation_values / scale, want["activation_values"] / scale, atol=TOLERANCE
    )
    np.testing.assert_array_equal(graph.selected_features, want["selected_features"])
    if knobs:  # the influence-ordered visit stopped short of every feature
        assert len(graph.selected_features) < len(graph.active_features)
    got, expected = graph.adjacency_matrix, want["adjacency_matrix"]
    assert got.shape == expected.shape
    largest = np.maximum(np.abs(expected).max(axis=1, keepdims=True), 1e-30)  # each row's
    np.testing.assert_allclose(got / largest, expected / largest, rtol=0, atol=TOLERANCE)
    assert (expected != 0).sum() > expected.shape[0]  # edges to compare

    pruned = prune(graph, options.node_threshold, options.edge_threshold)
    np.testing.assert_array_equal(pruned.node_mask, want["node_mask"])
    np.testing.assert_array_equal(pruned.edge_mask, want["edge_mask"])
    assert pruned.edge_mask.any() and not pruned.node_mask.all()
    np.testing.assert_allclose(pruned.cumulative_scores, want["cumulative_scores"], atol=TOLERANCE)
    np.testing.assert_allclose(scores(graph), want["scores"], rtol=0, atol=TOLERANCE)
