"""A real in-process server on port 0: the three RPCs, health, reflection, metrics."""

import urllib.request

import grpc
import httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from attnserve.client import ClientOptions, EncoderClient, build_request
from attnserve.model.artifacts import WEIGHTS_FILENAMES
from tests.conftest import SMALL_CONFIG, ServerThread


def test_encode_equals_the_runtime(client, small_runtime):
    texts = ["hello", "a longer sentence, with punctuation!"]
    out = client.encode(texts, request_id="req-1")
    assert out.request_id == "req-1"
    assert out.model_version == small_runtime.version
    assert 0 < out.inference_ns <= out.total_ns
    for text, encoding in zip(texts, out, strict=True):
        ids = np.array([[SMALL_CONFIG.bos_id, *text.encode()]])
        np.testing.assert_array_equal(encoding.token_ids, ids[0])
        np.testing.assert_allclose(encoding.embeddings, small_runtime.embed(ids)[0], atol=1e-5)
        assert encoding.attention is None and encoding.pooled is None


def test_attention_equals_the_runtime(client, small_runtime):
    ids = list(range(40))
    out = client.encode([ids], attention=True)
    embeddings, attentions = small_runtime.run(np.array([ids]))
    np.testing.assert_allclose(out[0].embeddings, embeddings[0], atol=1e-5)
    np.testing.assert_allclose(out[0].attention, attentions[0], atol=1e-6)
    assert out[0].layers == [0, 1] and out[0].heads == [0, 1, 2, 3]


def test_selected_layers_and_heads_come_in_the_order_asked(client, small_runtime):
    ids = list(range(10))
    out = client.encode([ids], layers=[1], heads=[3, 0])
    _, attentions = small_runtime.run(np.array([ids]))
    np.testing.assert_allclose(out[0].attention, attentions[0][[1]][:, [3, 0]], atol=1e-6)
    assert (out[0].layers, out[0].heads) == ([1], [3, 0])


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_pooling(client, pooling):
    out = client.encode("pool me", pooling=pooling)
    embeddings = out[0].embeddings
    want = embeddings.mean(axis=0) if pooling == "mean" else embeddings[-1]
    np.testing.assert_allclose(out[0].pooled, want, atol=1e-6)
    only_pooled = client.encode("pool me", pooling=pooling, token_embeddings=False)
    assert only_pooled[0].embeddings is None
    np.testing.assert_allclose(only_pooled[0].pooled, want, atol=1e-6)


def test_encode_stream_answers_in_order_and_survives_a_bad_request(client, small_runtime):
    requests = [
        build_request("first", request_id="a"),
        build_request([[999]], request_id="b"),  # outside the vocabulary
        build_request([[1, 2, 3]], attention=True, request_id="c"),
    ]
    answers = list(client.encode_stream(requests))
    assert [a.request_id for a in answers] == ["a", "b", "c"]
    assert answers[0].WhichOneof("outcome") == "response"
    assert answers[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "token id 999" in answers[1].error.message
    result = answers[2].response.results[0]
    assert list(result.token_ids) == [1, 2, 3]
    assert list(result.attention.shape) == [2, 4, 3, 3]


def test_model_info(client, small_runtime):
    info = client.model_info()
    assert info["name"] == SMALL_CONFIG.name
    assert info["version"] == small_runtime.version
    assert (info["n_layers"], info["n_heads"], info["d_model"]) == (2, 4, 64)
    assert info["max_seq_len"] == 300 and info["vocab_size"] == 259
    assert info["tokenizer"] == "byte" and info["provider"] == "cpu"
    # The weights: once on disk, and a copy per session in memory (two: attention, embeddings).
    weights = small_runtime.model_dir.path / WEIGHTS_FILENAMES["fp32"]
    assert int(info["weight_bytes"]) == weights.stat().st_size
    assert int(info["resident_weight_bytes"]) == 2 * weights.stat().st_size
    assert 0 < info["attention_max_abs_diff"] <= 1e-4  # float32: what export measured


def test_health_is_serving_for_the_server_and_the_service(server):
    with grpc.insecure_channel(server.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "attnserve.v1.EncoderService"):
            response = stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_the_services(server):
    with grpc.insecure_channel(server.address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = database.get_services()
        assert "attnserve.v1.EncoderService" in services
        assert "grpc.health.v1.Health" in services
        descriptor = database.FindFileContainingSymbol("attnserve.v1.EncoderService")
        assert descriptor.package == "attnserve.v1"


def test_metrics_endpoint_counts_requests(server, client):
    client.encode("count me")
    body = (
        urllib.request.urlopen(
            f"http://127.0.0.1:{server.running.metrics_port}/metrics", timeout=10
        )
        .read()
        .decode()
    )
    model = f'model="{SMALL_CONFIG.name}",version="1"'
    assert f'attnserve_requests_total{{code="OK",method="Encode",{model}}}' in body
    assert f"attnserve_tokens_total{{{model}}}" in body  # each model's series carry its labels
    for name in (
        "attnserve_queue_seconds",
        "attnserve_batch_size",
        "attnserve_tokens_total",
        "attnserve_queue_depth",
        "attnserve_request_latency_seconds",
    ):
        assert name in body


def test_not_ready_until_warm(small_model_dir, small_runtime):
    cold = ServerThread(small_model_dir, small_runtime, warm_up=False)
    try:
        with EncoderClient(cold.address, ClientOptions(retries=0)) as c:
            assert c.health() == "NOT_SERVING"
            with pytest.raises(grpc.RpcError) as excinfo:
                c.encode("too early")
            assert excinfo.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "warming up" in excinfo.value.details()
            # HTTP's probe asks the repository the same question, and says why
            cold_http = httpx.get(cold.http_url + "/health")
            assert cold_http.status_code == 503
            reason = cold.running.repository.unready_reason
            assert cold_http.json() == {"status": "NOT_SERVING", "reason": reason}
            assert reason is not None and reason.startswith(f"{SMALL_CONFIG.name}: ")
            cold.call(cold.running.warm_up())
            assert c.health() == "SERVING"
            assert httpx.get(cold.http_url + "/health").json() == {"status": "SERVING"}
            assert len(c.encode("now").encodings) == 1
    finally:
        cold.stop()


def test_bearer_token(small_model_dir, small_runtime):
    guarded = ServerThread(small_model_dir, small_runtime, auth_token="s3cret")
    try:
        with EncoderClient(guarded.address, ClientOptions(retries=0)) as anonymous:
            assert anonymous.health() == "SERVING"  # probes need no token
            with pytest.raises(grpc.RpcError) as excinfo:
                anonymous.encode("hi")
            assert excinfo.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as excinfo:
                list(anonymous.encode_stream([build_request("hi")]))
            assert excinfo.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with EncoderClient(guarded.address, ClientOptions(token="wrong", retries=0)) as bad:
            with pytest.raises(grpc.RpcError) as excinfo:
                bad.model_info()
            assert excinfo.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with EncoderClient(guarded.address, ClientOptions(token="s3cret")) as good:
            assert len(good.encode("hi").encodings) == 1
            assert good.model_info()["name"] == SMALL_CONFIG.name
    finally:
        guarded.stop()


def test_tls(small_model_dir, small_runtime, tmp_path):
    import subprocess

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    secure = ServerThread(small_model_dir, small_runtime, tls_cert=cert, tls_key=key)
    try:
        with EncoderClient(secure.address, ClientOptions(tls_root_cert=cert)) as c:
            assert len(c.encode("over tls").encodings) == 1
        plain = EncoderClient(secure.address, ClientOptions(retries=0, timeout_s=3))
        with plain, pytest.raises(grpc.RpcError):
            plain.encode("not over tls")
    finally:
        secure.stop()


def test_stream_request_ids_and_metric_labels(server, client):
    before = server.metric("attnserve_requests_total", {"method": "EncodeStream", "code": "OK"})
    list(client.encode_stream([build_request("x", request_id=str(i)) for i in range(3)]))
    after = server.metric("attnserve_requests_total", {"method": "EncodeStream", "code": "OK"})
    assert after - before == 3


@pytest.fixture(scope="module")
def long_model_dir(tmp_path_factory):
    """A model exported for 8,192 tokens: longer than the default batch token budget."""
    from dataclasses import replace

    from attnserve.export.model_dir import write_model_dir
    from attnserve.model.encoder import build_encoder

    out = tmp_path_factory.mktemp("long_model")
    model = build_encoder(replace(SMALL_CONFIG, max_seq_len=8192), seed=4)
    write_model_dir(model, out, shapes=[(1, 1), (2, 9)], log=lambda _: None)
    return out


def test_a_long_context_model_serves_with_its_context_as_the_batch_budget(long_model_dir):
    server = ServerThread(long_model_dir)
    try:
        with EncoderClient(server.address) as client:
            assert client.model_info()["max_batch_tokens"] == 8192
            out = client.encode([list(range(200))] * 2)
            assert [e.embeddings.shape for e in out] == [(200, SMALL_CONFIG.d_model)] * 2
    finally:
        server.stop()


def test_a_batch_budget_below_the_context_is_refused_in_one_line(long_model_dir):
    from tests.conftest import run_cli

    result = run_cli(
        "serve", "--model", str(long_model_dir), "--port", "0", "--http-port", "-1",
        "--metrics-port", "-1", "--provider", "cpu", "--max-batch-tokens", "4096",
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert "--max-batch-tokens 4096 cannot hold one sequence" in line
    assert "max_seq_len 8192" in line and "at least 8192" in line


@pytest.mark.parametrize("flag", ["--port", "--http-port", "--metrics-port"])
def test_a_taken_port_is_named_by_its_flag(small_model_dir, flag):
    import socket

    from tests.conftest import run_cli

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        ports = {"--port": "0", "--http-port": "0", "--metrics-port": "0", flag: str(port)}
        args = [item for pair in ports.items() for item in pair]
        result = run_cli(
            "serve", "--model", str(small_model_dir), "--host", "127.0.0.1", "--provider", "cpu",
            *args,
        )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert f"cannot listen on 127.0.0.1:{port} for {flag}" in line
    env = "ATTNSERVE_" + flag[2:].replace("-", "_").upper()
    assert f"choose another with {flag} or {env}" in line
