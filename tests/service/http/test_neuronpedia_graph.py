"""Neuronpedia's graph server's routes (service/http/neuronpedia_graph.py) on the default
model, which serves one transcoder set: POST /generate-graph answers the graph file
POST /v1/graph answers for the same prompt and knobs (that one is held to circuit-tracer's
own in tests/service/circuits); GET /check-busy says a graph is being computed while one
is; the secret, signed_url and a model with no set are refused by name, {"error"} shaped."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import ServerThread

SECRET = "np-secret"
KNOBS = {"max_feature_nodes": 60, "batch_size": 16, "node_threshold": 0.7}
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def server(default_export):
    running = ServerThread(default_export[0], auth_token=SECRET)
    yield running
    running.stop()


def post(server: ServerThread, path: str, body: dict, **headers: str) -> httpx.Response:
    headers = {"x-secret-key": SECRET, **headers}
    return httpx.post(f"{server.http_url}{path}", json=body, headers=headers, timeout=300)


def test_generate_graph_answers_the_graph_file_of_v1_graph(server):
    model = httpx.get(
        f"{server.http_url}/v1/models", headers={"authorization": f"Bearer {SECRET}"}
    ).json()["data"][0]["id"]
    body = {"prompt": PROMPT, "model_id": model, "slug_identifier": "add", **KNOBS}
    neuronpedia = post(server, "/generate-graph", body)
    assert neuronpedia.status_code == 200, neuronpedia.text
    ours = post(
        server,
        "/v1/graph",
        {"prompt": PROMPT, "transcoders": "plt", "slug": "add", **KNOBS, "batch_size": 16},
        authorization=f"Bearer {SECRET}",
    ).json()
    ours.pop("scores")
    got = neuronpedia.json()
    assert got == ours
    assert got["metadata"]["slug"] == "add" and got["metadata"]["scan"] == "attnserve-default-plt"
    assert any(node["feature_type"] == "cross layer transcoder" for node in got["nodes"])


def test_check_busy_says_whether_a_graph_is_being_computed(server):
    url = f"{server.http_url}/check-busy"
    headers = {"x-secret-key": SECRET}
    assert httpx.get(url, headers=headers).json() == {"busy": False}
    body = {"prompt": PROMPT, "transcoders": "plt", "stream": True, **KNOBS, "batch_size": 4}
    with httpx.stream(
        "POST", f"{server.http_url}/v1/graph", json=body,
        headers={"authorization": f"Bearer {SECRET}"}, timeout=300,
    ) as stream:  # fmt: skip
        lines = stream.iter_lines()
        assert "progress" in json.loads(next(lines))  # the graph has begun, and waits for us
        assert httpx.get(url, headers=headers).json() == {"busy": True}
        last = json.loads(list(lines)[-1])
    assert "nodes" in last
    assert httpx.get(url, headers=headers).json() == {"busy": False}


def test_refusals_name_what_is_wrong(server):
    base = {"prompt": PROMPT, "model_id": "", "slug_identifier": "x"}
    without = httpx.post(f"{server.http_url}/generate-graph", json=base, timeout=60)
    assert without.status_code == 401 and "X-SECRET-KEY" in without.json()["error"]
    signed = post(server, "/generate-graph", {**base, "signed_url": "https://example.com/x"})
    assert signed.status_code == 400 and signed.json()["error"].startswith("signed_url:")
    unknown = post(server, "/generate-graph", {**base, "max_feature_node": 5})
    assert unknown.status_code == 400 and "max_feature_node" in unknown.json()["error"]
    bad = post(server, "/generate-graph", {**base, "edge_threshold": 3.0})
    assert bad.status_code == 400
    assert bad.json()["error"] == "edge_threshold: must be between 0 and 1, not 3.0"
