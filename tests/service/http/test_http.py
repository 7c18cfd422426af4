"""The HTTP transport through a real server: OpenAI's own SDK as a client of /v1/embeddings,
the JSON mirror of Encode, health, and the error table's HTTP column."""

from __future__ import annotations

import base64
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import httpx
import numpy as np
import pytest
from openai import OpenAI

from attnserve.client import build_request
from tests.conftest import SMALL_CONFIG, ServerThread
from tests.service.fakes import FakeBackend

MODEL = SMALL_CONFIG.name
TEXTS = ["The cat sat on the mat.", "Attention is all you need!"]


@pytest.fixture(scope="module")
def openai_client(server):
    return OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)


def test_openai_sdk_embeddings_equal_grpc_last_token_pooling(server, client, openai_client):
    grpc = client.encode(TEXTS, pooling="last", token_embeddings=False)
    for encoding_format in ("float", "base64", None):  # None: the SDK asks base64, decodes
        kwargs = {"encoding_format": encoding_format} if encoding_format else {}
        response = openai_client.embeddings.create(model=MODEL, input=TEXTS, **kwargs)
        assert [d.index for d in response.data] == [0, 1]
        for data, encoding in zip(response.data, grpc, strict=True):
            embedding = data.embedding
            if isinstance(embedding, str):
                embedding = np.frombuffer(base64.b64decode(embedding), dtype="<f4")
            np.testing.assert_allclose(embedding, encoding.pooled, atol=1e-5, rtol=0)
        tokens = sum(len(e.token_ids) for e in grpc)
        assert response.usage.prompt_tokens == response.usage.total_tokens == tokens
        assert response.model == "attnserve-encoder"


def test_every_openai_input_shape(openai_client, client):
    ids = [257, 72, 105]
    one_text = openai_client.embeddings.create(model=MODEL, input=TEXTS[0]).data
    token_array = openai_client.embeddings.create(model=MODEL, input=ids).data
    token_arrays = openai_client.embeddings.create(model=MODEL, input=[ids, ids[:2]]).data
    assert len(one_text) == 1 and len(token_array) == 1 and len(token_arrays) == 2
    want = client.encode([ids, ids[:2]], pooling="last")
    np.testing.assert_allclose(token_array[0].embedding, want[0].pooled, atol=1e-5)
    np.testing.assert_allclose(token_arrays[1].embedding, want[1].pooled, atol=1e-5)


def test_models_and_health(server):
    models = httpx.get(server.http_url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "attnserve-encoder"
    assert httpx.get(server.http_url + "/health").json() == {"status": "SERVING"}
    assert httpx.get(server.http_url + "/health/live").status_code == 200
    docs = httpx.get(server.http_url + "/openapi.json").json()
    assert {"/v1/embeddings", "/v1/encode", "/v1/models", "/health"} <= set(docs["paths"])


def test_connections_send_without_nagle(server):
    """A keep-alive client would otherwise wait out its delayed ACK (~40 ms) whenever the
    body goes out apart from the headers: every request, at any size."""
    with httpx.Client(base_url=server.http_url) as http:
        http.get("/health/live")  # the connection stays open (keep-alive)

        async def accepted_sockets():
            connections = server.running.http.connections()
            return [c.transport.get_extra_info("socket") for c in connections]

        sockets = server.call(accepted_sockets())
        assert sockets
        for sock in sockets:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_encode_json_mirror_with_readable_tensors(server, client, small_runtime):
    body = {
        "inputs": [{"text": "The cat sat."}, {"tokenIds": {"ids": [257, 84, 104]}}],
        "options": {"pooling": "POOLING_MEAN", "attention": {"layers": [1], "heads": [0, 3]}},
        "request_id": "r-1",
        "tensor_format": "list",
    }
    out = httpx.post(server.http_url + "/v1/encode", json=body).json()
    assert out["requestId"] == "r-1" and len(out["results"]) == 2
    grpc = client.encode(["The cat sat.", [257, 84, 104]], pooling="mean", layers=[1], heads=[0, 3])
    for result, encoding in zip(out["results"], grpc, strict=True):
        embeddings = result["embeddings"]
        assert embeddings["dtype"] == "float32"
        assert embeddings["shape"] == list(encoding.embeddings.shape)
        np.testing.assert_allclose(embeddings["values"], encoding.embeddings, atol=1e-6)
        np.testing.assert_allclose(result["pooled"]["values"], encoding.pooled, atol=1e-6)
        attention = np.array(result["attention"]["values"])
        assert attention.shape == (1, 2, len(encoding.token_ids), len(encoding.token_ids))
        np.testing.assert_allclose(attention, encoding.attention, atol=1e-6)


def test_encode_json_default_is_the_grpc_bytes(server, client):
    request = build_request("hello", pooling="last")
    out = httpx.post(
        server.http_url + "/v1/encode",
        json={"inputs": [{"text": "hello"}], "options": {"pooling": "POOLING_LAST"}},
    ).json()
    pooled = out["results"][0]["pooled"]
    assert pooled["dtype"] == "DTYPE_FLOAT32"
    values = np.frombuffer(base64.b64decode(pooled["data"]), dtype="<f4")
    grpc = client.encode(request.inputs[0].text, pooling="last")
    np.testing.assert_allclose(values, grpc[0].pooled, atol=1e-6)


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/embeddings", {"model": MODEL, "input": [[1, 999]]}, 400, "token id 999 is outside"),
        ("/v1/embeddings", {"model": MODEL, "input": []}, 400, "input: at least one input"),
        ("/v1/embeddings", {"model": MODEL}, 400, "input: Field required"),
        ("/v1/embeddings", {"input": "x", "dimensions": 3}, 400, "dimensions: this model's"),
        ("/v1/encode", {"inputs": [{"text": "x"}], "tensor_format": "csv"}, 400, "tensor_format"),
        ("/v1/encode", {"inputz": []}, 400, "inputz: not a field of attnserve.v1.EncodeRequest"),
        ("/v1/encode", {"inputs": [{"text": "x"}], "options": {"attention": {"layers": [7]}}},
         400, "options.attention.layers: 7 is outside [-2, 2)"),
        ("/v1/embeddings", {"model": MODEL, "input": [[1, 2**63]]}, 400,
         "input[0]: token id 9223372036854775808 is out of range"),
        ("/v1/embeddings", {"model": MODEL, "input": [[-(2**63) - 1]]}, 400, "input[0]: token id"),
        ("/v1/encode", {"inputs": [{"token_ids": {"ids": [2**63]}}]}, 400, "ids"),
    ],
)  # fmt: skip
def test_invalid_requests_are_400_in_openai_shape(server, path, body, status, message):
    response = httpx.post(server.http_url + path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert message in error["message"]
    assert error["type"] == "invalid_request_error"
    assert httpx.get(server.http_url + "/health").json()["status"] == "SERVING"  # still serving


def test_body_and_answer_limits_are_413(small_model_dir, small_runtime):
    small = ServerThread(small_model_dir, small_runtime, max_message_bytes=20_000)
    try:
        big = {"model": MODEL, "input": "x" * 30_000}
        response = httpx.post(small.http_url + "/v1/embeddings", json=big)
        assert response.status_code == 413
        assert "20,000-byte message limit" in response.json()["error"]["message"]
        attention = {"inputs": [{"text": "y" * 200}], "options": {"attention": {}}}
        response = httpx.post(small.http_url + "/v1/encode", json=attention)
        assert response.status_code == 413
        assert "ATTENTION_LAYOUT_CAUSAL_PACKED" in response.json()["error"]["message"]
    finally:
        small.stop()


def test_warming_up_is_503_and_a_full_queue_is_429(small_model_dir):
    backend = FakeBackend()
    cold = ServerThread(small_model_dir, backend, warm_up=False, max_queue=1)
    try:
        body = {"model": MODEL, "input": "hi"}
        response = httpx.post(cold.http_url + "/v1/embeddings", json=body)
        assert response.status_code == 503 and "warming up" in response.json()["error"]["message"]
        assert httpx.get(cold.http_url + "/health").status_code == 503
        cold.call(cold.running.warm_up())
        backend.gate.clear()  # the model is stuck: one request inside it, one queued
        with (
            httpx.Client(base_url=cold.http_url, timeout=60) as http,
            ThreadPoolExecutor(2) as pool,
        ):
            running = pool.submit(http.post, "/v1/embeddings", json=body)
            backend.wait_calls(1)
            queued = pool.submit(http.post, "/v1/embeddings", json=body)
            while cold.running.engine.depth < 1:  # wait until it is queued
                time.sleep(0.001)
            refused = http.post("/v1/embeddings", json=body)
            backend.gate.set()
            assert running.result().status_code == queued.result().status_code == 200
        assert refused.status_code == 429
        assert refused.json()["error"]["type"] == "rate_limit_error"
    finally:
        backend.gate.set()
        cold.stop()


def test_bearer_token_and_cors(small_model_dir, small_runtime):
    secured = ServerThread(
        small_model_dir,
        small_runtime,
        auth_token="s3cret",
        http_cors_origins="https://notebook.example",
    )
    try:
        body = {"model": MODEL, "input": "hi"}
        refused = httpx.post(secured.http_url + "/v1/embeddings", json=body)
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
        headers = {"Authorization": "Bearer s3cret", "Origin": "https://notebook.example"}
        ok = httpx.post(secured.http_url + "/v1/embeddings", json=body, headers=headers)
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "https://notebook.example"
        assert httpx.get(secured.http_url + "/health").status_code == 200  # probes need no token
    finally:
        secured.stop()


def test_cors_is_off_by_default(server):
    response = httpx.get(server.http_url + "/v1/models", headers={"Origin": "https://x.example"})
    assert "access-control-allow-origin" not in response.headers


def test_the_explorer_is_served_offline(server):
    page = httpx.get(server.http_url + "/")
    assert page.status_code == 200 and 'id="heatmap"' in page.text
    for asset in ("/explorer/explorer.js", "/explorer/graph.js", "/explorer/explorer.css"):
        response = httpx.get(server.http_url + asset)
        assert response.status_code == 200
        assert "http://" not in response.text and "https://" not in response.text  # no CDN
    assert "https://" not in page.text and "http://" not in page.text


def test_an_unexpected_error_is_500_logged_and_counted(small_model_dir, caplog):
    server = ServerThread(small_model_dir, FakeBackend())
    plane = server.running.dataplane
    plane.view = replace(plane.view, tokenizer=None)  # a bug: text cannot be tokenized
    try:
        response = httpx.post(server.http_url + "/v1/embeddings", json={"input": "boom"})
        assert response.status_code == 500
        assert response.json()["error"]["type"] == "server_error"
        assert "POST /v1/embeddings failed unexpectedly" in caplog.text
        labels = {"method": "POST /v1/embeddings", "code": "INTERNAL"}
        assert server.metric("attnserve_requests_total", labels) == 1
    finally:
        server.stop()


def test_an_unknown_model_is_404_model_not_found(server, openai_client):
    response = httpx.post(server.http_url + "/v1/embeddings", json={"model": "gpt-5", "input": "x"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and MODEL in error["message"]
    import openai

    with pytest.raises(openai.NotFoundError):  # what OpenAI's SDK makes of it
        openai_client.embeddings.create(model="gpt-5", input="x")


@pytest.mark.parametrize(
    ("method", "path", "content", "status", "message"),
    [
        ("GET", "/v1/nothing", None, 404, "GET /v1/nothing: Not Found"),
        ("GET", "/v1/embeddings", None, 405, "Method Not Allowed"),
        (
            "POST",
            "/v1/embeddings",
            b'{"input": "\xff\xfe"}',
            400,
            "not UTF-8 JSON: invalid start byte at byte 11",
        ),
        ("POST", "/v1/embeddings", b'{"input": "x"', 400, "JSON"),
    ],
)
def test_framework_refusals_come_in_the_apis_shape(server, method, path, content, status, message):
    headers = {"content-type": "application/json"}
    response = httpx.request(method, server.http_url + path, content=content, headers=headers)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert "detail" not in response.json() and message in error["message"]
    assert error["type"] == "invalid_request_error"


def test_v2_refusals_come_in_the_protocols_shape(server):
    response = httpx.get(server.http_url + "/v2/nothing")
    assert response.status_code == 404 and "Not Found" in response.json()["error"]


def test_an_oversized_body_is_413_with_or_without_its_length(small_model_dir, small_runtime):
    small = ServerThread(small_model_dir, small_runtime, max_message_bytes=20_000)
    body = b'{"model": "%s", "input": "%s"}' % (MODEL.encode(), b"x" * 30_000)

    def chunks():  # no Content-Length: sent chunked
        for i in range(0, len(body), 4096):
            yield body[i : i + 4096]

    try:
        for content in (body, chunks()):
            response = httpx.post(
                small.http_url + "/v1/embeddings",
                content=content,
                headers={"content-type": "application/json"},
            )
            assert response.status_code == 413
            assert "20,000-byte message limit" in response.json()["error"]["message"]
        v2 = httpx.post(small.http_url + "/v2/models/x/infer", content=chunks())
        assert v2.status_code == 413 and "message limit" in v2.json()["error"]
    finally:
        small.stop()


def test_http_calls_have_a_deadline(small_model_dir):
    """A call queued past its deadline is dropped unrun and answered 504, like gRPC's; a
    client's Request-Timeout sets its own, longer than the server's default up to its
    maximum (long texts' statistics take minutes)."""
    backend = FakeBackend()
    slow = ServerThread(small_model_dir, backend, http_timeout_s=0.5, max_http_timeout_s=120)
    try:
        backend.gate.clear()  # the model is stuck: one request inside it, the next queued
        body = {"model": MODEL, "input": "hi"}
        with (
            httpx.Client(base_url=slow.http_url, timeout=60) as http,
            ThreadPoolExecutor(1) as pool,
        ):
            long = {"Request-Timeout": "60"}  # past the server's default of 0.5 s
            running = pool.submit(http.post, "/v1/embeddings", json=body, headers=long)
            backend.wait_calls(1)
            late = http.post("/v1/embeddings", json=body)  # the default: 0.5 s
            assert late.status_code == 504 and late.json()["error"]["type"] == "timeout"
            bad = http.post("/v1/embeddings", json=body, headers={"Request-Timeout": "soon"})
            assert bad.status_code == 400 and "Request-Timeout" in bad.json()["error"]["message"]
            over = http.post("/v1/embeddings", json=body, headers={"Request-Timeout": "121"})
            assert over.status_code == 400 and "--max-http-timeout-s" in over.text
            backend.gate.set()  # the long call, 0.5 s past the default's deadline, answers
            assert running.result().status_code == 200
            assert len(backend.calls) == 1  # the late one never ran
    finally:
        backend.gate.set()
        slow.stop()


def test_encode_takes_the_interventions_the_completions_take(server):
    """`op: "add"` and values as a plain list (as /v1/completions takes them) change the
    run exactly as protobuf's own JSON (an enum name, a base64 Tensor) does; enums go by
    their word elsewhere too ("pooling": "mean"); a word that is none is refused with
    those it may be."""
    rng = np.random.default_rng(3)
    vector = rng.normal(0, 4.0, SMALL_CONFIG.d_model).astype(np.float32)
    tensor = {"shape": [len(vector)], "dtype": "DTYPE_FLOAT32",
              "data": base64.b64encode(vector.tobytes()).decode()}  # fmt: skip

    def pooled(intervention: dict, pooling: str) -> np.ndarray:
        options = {"pooling": pooling, "interventions": [intervention]}
        body = {"inputs": [{"text": "The cat sat."}], "options": options, "tensor_format": "list"}
        answer = httpx.post(f"{server.http_url}/v1/encode", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        return np.array(answer.json()["results"][0]["pooled"]["values"])

    hook = "blocks.1.hook_resid_pre"
    protobuf = pooled({"hook": hook, "op": "INTERVENTION_OP_ADD", "values": tensor}, "POOLING_MEAN")
    plain = pooled({"hook": hook, "op": "add", "values": vector.tolist()}, "mean")
    np.testing.assert_allclose(plain, protobuf, atol=1e-6)
    unchanged = pooled({"hook": hook, "op": "add", "values": [0.0] * len(vector)}, "mean")
    assert np.abs(unchanged - plain).max() > 1e-3  # the vector changed the run
    body = {"inputs": [{"text": "x"}], "options": {"interventions": [{"hook": hook, "op": "plus"}]}}
    error = httpx.post(f"{server.http_url}/v1/encode", json=body, timeout=60).json()["error"]
    assert error["param"] == "options.interventions[0].op"
    assert error["message"].endswith("'plus' is not one of add, set, scale, clamp")
