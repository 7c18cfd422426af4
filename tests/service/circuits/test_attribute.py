"""Attribution graphs (service/circuits) against circuit-tracer 0.5.0's, on the same tiny
random checkpoints and transcoder sets, in float32 on the CPU: Llama with GQA and Gemma 2
(sandwich norms, soft-caps, tied embeddings scaled by sqrt(d)), layer 0's MLP writing an
outlier dimension in the thousands and transcoders scaled to the values they read and write
(perf/circuit_tracer_peer.py builds them with circuit-tracer's own transformers, and runs
its attribute(), prune_graph() and compute_graph_scores()). Every active feature visited in
order, and the influence-ordered visit of a few (max_feature_nodes), with other knobs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest

from attnserve.client import EncoderClient
from attnserve.export.transcoder_set import add_transcoder_set
from attnserve.service.circuits.attribute import attribute
from attnserve.service.circuits.graph import GraphOptions
from attnserve.service.circuits.influence import prune, scores
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from perf.peer_env import CIRCUIT_TRACER
from tests.conftest import ServerThread, run_cli
from tests.service.ort.test_transcoders import served

IDS = [1, 40, 17, 250, 99, 3, 77, 180, 64, 12]  # <s> first: circuit-tracer prepends nothing
INFLUENCE_ORDERED = dict(max_feature_nodes=150, batch_size=32, max_n_logits=4)
KNOBS = ({}, {**INFLUENCE_ORDERED, "node_threshold": 0.6, "edge_threshold": 0.9})
TOLERANCE = 1e-4


# Each family's transcoders read where trained ones do: Llama's (circuit-tracer's own) what
# the MLP reads, Gemma Scope's its norm's x standardized, both sites a norm computes from the
# stream (export/sae_site.py)
INPUT_HOOKS = {"llama": "mlp.hook_in", "gemma2": "ln2.hook_normalized"}


@pytest.fixture(scope="module", params=sorted(INPUT_HOOKS))
def case(request, circuit_tracer_python, tmp_path_factory):
    """(the served replacement model, the folder circuit-tracer reads) of one family."""
    folder = tmp_path_factory.mktemp(request.param)
    subprocess.run(
        [str(circuit_tracer_python), str(CIRCUIT_TRACER.script), "build",
         "--family", request.param, "--out", str(folder),
         "--input-hook", INPUT_HOOKS[request.param]],
        check=True,
    )  # fmt: skip
    model_dir = folder / "attnserve"
    result = run_cli("export", "--from-hf", str(folder / "model"), "--out", str(model_dir))
    assert result.returncode == 0, result.stderr
    add_transcoder_set(model_dir, folder / "transcoders", name="plt", log=lambda _: None)
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    return runtime.replacement("plt"), folder, circuit_tracer_python, model_dir


_RUNS: dict[tuple[Path, str], Path] = {}  # circuit-tracer's graphs, by folder and knobs


def circuit_tracer(python: Path, folder: Path, knobs: dict, out: Path):
    """circuit-tracer's graph of IDS (its arrays; its graph file beside them, OUT.json),
    computed once per folder and knobs."""
    key = folder, json.dumps(knobs, sort_keys=True)
    if key not in _RUNS:
        subprocess.run(
            [str(python), str(CIRCUIT_TRACER.script), "attribute", str(folder),
             "--ids", ",".join(map(str, IDS)), "--out", str(out), "--knobs", key[1]],
            check=True,
        )  # fmt: skip
        _RUNS[key] = out
    elif _RUNS[key] != out:
        shutil.copy(_RUNS[key].with_suffix(".json"), out.with_suffix(".json"))
    return np.load(_RUNS[key])


@pytest.mark.parametrize("knobs", KNOBS, ids=["defaults", "influence-ordered"])
def test_the_graph_is_circuit_tracers(case, knobs, tmp_path):
    replacement, folder, python, _ = case
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


def test_served_features_are_circuit_tracers_activations(case, tmp_path):
    """Each layer's transcoder served like an SAE (its site computed from the stream by the
    model's norm: export/sae_site.py) on the prompt: circuit-tracer's active features
    and activations at every position after the first (which it zeroes)."""
    replacement, folder, python, model_dir = case
    want = circuit_tracer(python, folder, {}, tmp_path / "graph.npz")
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    outputs = served(runtime, list(replacement.members), np.array([IDS]), [len(IDS)])
    dense = outputs[0].features.activations  # (layers, T, S)
    dense[:, 0] = 0
    layer, position, feature = want["active_features"].T
    np.testing.assert_array_equal(np.argwhere(dense > 0), want["active_features"])
    scale = np.abs(want["activation_values"]).max()
    got = dense[layer, position, feature]
    np.testing.assert_allclose(got / scale, want["activation_values"] / scale, atol=TOLERANCE)


@pytest.mark.parametrize("case", ["llama"], indirect=True)  # the API, on one family
def test_every_api_answers_circuit_tracers_graph_file(case, tmp_path):
    """POST /v1/graph and attnserve.v1's Graph (the client's `graph`) answer the file
    circuit-tracer's create_graph_files writes of the same graph (slug "graph", as both
    name it here), field for field; the progress counts every row; a text is attributed
    as its ids with the bos token put first."""
    _, folder, python, model_dir = case
    want_arrays = circuit_tracer(python, folder, {}, tmp_path / "graph.npz")
    want = json.loads((tmp_path / "graph.json").read_text())
    server = ServerThread(model_dir)
    try:
        body = {"prompt": IDS, "transcoders": "plt", "include_adjacency": True}
        http = httpx.post(f"{server.http_url}/v1/graph", json=body, timeout=300).json()
        asked = {"prompt": IDS, "transcoders": "plt", "top_logits": 3}
        with_logits = httpx.post(f"{server.http_url}/v1/graph", json=asked, timeout=300).json()
        too_many = httpx.post(f"{server.http_url}/v1/graph", json={**asked, "top_logits": 33})
        lines = [
            json.loads(line)
            for line in httpx.post(
                f"{server.http_url}/v1/graph", json={**body, "stream": True}, timeout=300
            ).text.splitlines()
        ]
        progress: list[tuple[int, int]] = []
        with EncoderClient(server.address) as client:
            served = client.graph(IDS, "plt", progress=lambda *p: progress.append(p))
            text = "The cat"
            of_text = client.graph(text, "plt", max_feature_nodes=20, batch_size=8)
            bos = client.model_info()["bos_id"]
            of_ids = client.graph([bos, *text_ids(model_dir, text)], "plt",
                                  max_feature_nodes=20, batch_size=8)  # fmt: skip
    finally:
        server.stop()
    replacement, completeness = want_arrays["scores"]
    scores = {"replacement": replacement, "completeness": completeness}
    for got in (http, served, lines[-1]):
        assert_same_file(got, want)
        assert got["scores"] == pytest.approx(scores, abs=TOLERANCE)
    adjacency = np.array(http["adjacency"]["adjacency_matrix"], np.float32)
    largest = np.maximum(np.abs(want_arrays["adjacency_matrix"]).max(1, keepdims=True), 1e-30)
    np.testing.assert_allclose(
        adjacency / largest, want_arrays["adjacency_matrix"] / largest, atol=TOLERANCE
    )
    assert http["adjacency"]["input_tokens"] == IDS
    total = len(want_arrays["logit_targets"]) + len(want_arrays["selected_features"])
    assert progress[0] == (0, total) and progress[-1] == (total, total)
    assert [rows for rows, _ in progress] == sorted(rows for rows, _ in progress)
    assert [line["progress"]["rows"] for line in lines[:-1]] == [rows for rows, _ in progress]
    assert of_text["metadata"]["prompt_tokens"][0] == of_ids["metadata"]["prompt_tokens"][0]
    assert_same_file(of_text, of_ids)
    assert "feature_logits" not in http
    assert_same_file(with_logits, want)
    assert_top_logits(with_logits, folder, model_dir, 3)
    assert too_many.status_code == 400
    assert "top_logits: must be from 0 to 32, not 33" in too_many.json()["error"]["message"]


def assert_top_logits(graph: dict, folder: Path, model_dir: Path, k: int) -> None:
    """Each feature node's k tokens, as its decoder row times the checkpoint's unembedding
    says (numpy, from the files circuit-tracer reads)."""
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    checkpoint = load_file(str(folder / "model" / "model.safetensors"))
    unembedding = checkpoint.get("lm_head.weight", checkpoint["model.embed_tokens.weight"])
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    features = {
        n["jsNodeId"] for n in graph["nodes"] if n["feature_type"] == "cross layer transcoder"
    }
    assert features and set(graph["feature_logits"]) == features
    for js_id in features:
        layer, feature = map(int, js_id.removesuffix("-0").split("_"))
        row = load_file(str(folder / "transcoders" / f"layer_{layer}.safetensors"))["W_dec"][
            feature
        ]
        logits = unembedding.astype(np.float64) @ row.astype(np.float64)  # (V,)
        top = np.argsort(-logits, kind="stable")[:k]
        got = graph["feature_logits"][js_id]
        assert [t["token"] for t in got] == [
            tokenizer.decode([int(t)], skip_special_tokens=False) for t in top
        ]
        np.testing.assert_allclose([t["logit"] for t in got], logits[top], rtol=1e-4, atol=1e-5)


def text_ids(model_dir: Path, text: str) -> list[int]:
    """The text's ids by the tokenizers library itself, no special token added."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return tokenizer.encode(text, add_special_tokens=False).ids


def assert_same_file(got: dict, want: dict) -> None:
    """The same graph file: metadata and qParams equal, the same nodes with the same fields
    (their numbers within TOLERANCE), the same links (weights within TOLERANCE of the
    largest into their target)."""
    assert got["metadata"] == want["metadata"]
    assert got["qParams"] == want["qParams"]
    numbers = ("influence", "activation", "token_prob")
    assert [n["node_id"] for n in got["nodes"]] == [n["node_id"] for n in want["nodes"]]
    for mine, theirs in zip(got["nodes"], want["nodes"], strict=True):
        assert list(mine) == list(theirs)  # every field, in circuit-tracer's order
        assert {k: v for k, v in mine.items() if k not in numbers} == {
            k: v for k, v in theirs.items() if k not in numbers
        }
        for key in numbers:
            if theirs[key] is None:
                assert mine[key] is None, key
            else:
                assert mine[key] == pytest.approx(theirs[key], abs=TOLERANCE), key
    pairs = [(link["source"], link["target"]) for link in got["links"]]
    assert pairs == [(link["source"], link["target"]) for link in want["links"]]
    largest: dict[str, float] = {}
    for link in want["links"]:
        largest[link["target"]] = max(largest.get(link["target"], 0.0), abs(link["weight"]))
    for mine, theirs in zip(got["links"], want["links"], strict=True):
        scale = largest[theirs["target"]]
        assert abs(mine["weight"] - theirs["weight"]) <= TOLERANCE * scale
