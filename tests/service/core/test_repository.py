"""A repository of models: every API routes by model name, tritonclient drives the repository
extension unmodified, and a reload under load fails no request. Real exported models in a
real repository folder, real servers on port 0."""

from __future__ import annotations

import logging
import shutil
import threading

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from openai import OpenAI
from tritonclient.utils import InferenceServerException

from attnserve.client import ClientOptions, EncoderClient
from attnserve.oip import grpc_service_pb2 as oip
from attnserve.oip import grpc_service_pb2_grpc as oip_grpc
from attnserve.service.core import dataplane, repository
from attnserve.service.oip.model import OipProtocol
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from tests.conftest import OTHER_CONFIG, SMALL_CONFIG, ServerThread, make_repository

IDS = [5, 6, 7, 8]


def reference(model_dir) -> np.ndarray:
    """What a model directory's full graph gives for IDS, in ONNX Runtime directly."""
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    return runtime.embed(np.array([IDS], dtype=np.int64))[0]


@pytest.fixture(scope="module")
def references(small_model_dir, other_model_dir) -> dict[str, np.ndarray]:
    return {"a": reference(small_model_dir), "b": reference(other_model_dir)}


def test_every_api_routes_by_model_name(two_models, references):
    with EncoderClient(two_models.address, ClientOptions(timeout_s=60)) as client:
        for name in ("a", "b"):
            out = client.encode(IDS, model=name)
            np.testing.assert_allclose(out[0].embeddings, references[name], atol=1e-5, rtol=0)
            assert client.model_info(model=name)["name"] == name
        # No model named: the default model (--default-model a).
        np.testing.assert_allclose(client.encode(IDS)[0].embeddings, references["a"], atol=1e-5)

    openai = OpenAI(base_url=f"{two_models.http_url}/v1", api_key="unused")
    assert [m.id for m in openai.models.list().data] == ["a", "b"]
    vector = openai.embeddings.create(model="b", input=[IDS]).data[0].embedding
    np.testing.assert_allclose(vector, references["b"][-1], atol=1e-5, rtol=0)

    triton = triton_grpc.InferenceServerClient(two_models.address)
    tensor = triton_grpc.InferInput("input_ids", [1, len(IDS)], "INT64")
    tensor.set_data_from_numpy(np.array([IDS], dtype=np.int64))
    for name in ("a", "b"):
        result = triton.infer(name, [tensor], outputs=[triton_grpc.InferRequestedOutput("pooled")])
        np.testing.assert_allclose(result.as_numpy("pooled")[0], references[name][-1], atol=1e-5)
        assert triton.get_model_metadata(name).versions == ["1"]
        assert triton.is_model_ready(name, "1")
    assert not triton.is_model_ready("a", "2")


def test_an_unknown_model_is_not_found_in_each_apis_shape(two_models):
    with EncoderClient(two_models.address) as client:
        with pytest.raises(grpc.RpcError) as error:
            client.encode(IDS, model="nope")
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        assert "'nope'" in error.value.details() and "served: a, b" in error.value.details()
    with httpx.Client(base_url=two_models.http_url) as http:
        answer = http.post("/v1/embeddings", json={"model": "nope", "input": "x"})
        assert answer.status_code == 404
        assert answer.json()["error"]["code"] == "model_not_found"
        tensor = {"name": "input_ids", "datatype": "INT64", "shape": [1, 4], "data": IDS}
        answer = http.post("/v2/models/nope/infer", json={"inputs": [tensor]})
        assert answer.status_code == 404 and "nope" in answer.json()["error"]
        assert http.get("/v2/models/a/versions/7").status_code == 404
    # The server goes on serving.
    with EncoderClient(two_models.address) as client:
        assert len(client.encode(IDS, model="b")[0].token_ids) == len(IDS)


def test_series_and_statistics_are_per_model_and_version(two_models):
    with EncoderClient(two_models.address) as client:
        client.encode(IDS, model="b")
    labels = {"method": "Encode", "code": "OK", "model": "b", "version": "1"}
    assert two_models.metric("attnserve_requests_total", labels) >= 1
    assert two_models.metric("attnserve_tokens_total", {"model": "b", "version": "1"}) >= len(IDS)
    stats = httpx.get(f"{two_models.http_url}/v2/models/b/stats").json()["model_stats"]
    assert [(s["name"], s["version"]) for s in stats] == [("b", "1")]


def test_every_call_that_names_a_model_is_counted_by_it(two_models):
    """One rule on every transport: a call that names a model is counted under its method
    with the model and version it found (none: model ""); server-wide calls are not."""
    requests = two_models.running.metrics.requests

    def count(method: str, code: str = "OK", model: str = "b") -> float:
        labels = {"method": method, "code": code, "model": model}
        return two_models.metric("attnserve_requests_total", labels)

    calls = {
        "ModelMetadata": lambda stub: stub.ModelMetadata(oip.ModelMetadataRequest(name="b")),
        "ModelConfig": lambda stub: stub.ModelConfig(oip.ModelConfigRequest(name="b")),
        "ModelReady": lambda stub: stub.ModelReady(oip.ModelReadyRequest(name="b")),
        "ModelStatistics": lambda stub: stub.ModelStatistics(oip.ModelStatisticsRequest(name="b")),
    }
    with grpc.insecure_channel(two_models.address) as channel:
        stub = oip_grpc.GRPCInferenceServiceStub(channel)
        for method, call in calls.items():
            before = count(method)
            call(stub)
            assert count(method) == before + 1, method
        before = count("ModelMetadata", "NOT_FOUND", "")
        with pytest.raises(grpc.RpcError):
            stub.ModelMetadata(oip.ModelMetadataRequest(name="nope"))
        assert count("ModelMetadata", "NOT_FOUND", "") == before + 1
        stub.ServerLive(oip.ServerLiveRequest())
        stub.ServerMetadata(oip.ServerMetadataRequest())
    with httpx.Client(base_url=two_models.http_url) as http:
        for path, method in (("", "metadata"), ("/ready", "ready"), ("/config", "config")):
            before = count(f"GET /v2/{method}")
            assert http.get(f"/v2/models/b{path}").status_code == 200
            assert count(f"GET /v2/{method}") == before + 1
        http.get("/v2/health/live")
        http.get("/v2")
    counted = {sample.labels["method"] for sample in requests.collect()[0].samples}
    assert not counted & {"ServerLive", "ServerMetadata", "GET /v2", "GET /v2/health/live"}


def test_an_unexpected_error_in_any_call_is_logged_and_internal(two_models, caplog, monkeypatch):
    """Server-wide calls too (they are not counted): the transports' error wrappers log."""

    def broken(self) -> dict:
        raise RuntimeError("a bug in the metadata")

    monkeypatch.setattr(OipProtocol, "server_metadata", broken)
    with caplog.at_level(logging.ERROR), grpc.insecure_channel(two_models.address) as channel:
        with pytest.raises(grpc.RpcError) as excinfo:
            oip_grpc.GRPCInferenceServiceStub(channel).ServerMetadata(oip.ServerMetadataRequest())
        assert excinfo.value.code() == grpc.StatusCode.INTERNAL
        assert httpx.get(f"{two_models.http_url}/v2").status_code == 500
    assert "ServerMetadata failed unexpectedly" in caplog.text
    assert "GET /v2 failed unexpectedly" in caplog.text
    assert "a bug in the metadata" in caplog.text


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_tritonclient_drives_the_repository_extension(
    tmp_path, small_model_dir, other_model_dir, protocol
):
    """The index lists every model; unload stops one, load brings it back (Triton's
    extension, through tritonclient's own calls)."""
    root = make_repository(tmp_path, small_model_dir, other_model_dir)
    server = ServerThread(None, model_repository=root, default_model="a")
    try:
        if protocol == "grpc":
            triton = triton_grpc.InferenceServerClient(server.address)
            index = triton.get_model_repository_index(as_json=True)["models"]
        else:
            triton = triton_http.InferenceServerClient(server.http_url.removeprefix("http://"))
            index = triton.get_model_repository_index()
        assert [(m["name"], m["version"], m["state"]) for m in index] == [
            ("a", "1", "READY"),
            ("b", "1", "READY"),
        ]
        assert "model_repository" in triton.get_server_metadata(**_json(protocol))["extensions"]
        triton.unload_model("b")
        assert not triton.is_model_ready("b")
        states = {m["name"]: m for m in _index(triton, protocol)}
        assert states["b"]["state"] == "UNAVAILABLE" and states["b"]["reason"] == "unloaded"
        with pytest.raises(InferenceServerException, match="nope"):
            triton.load_model("nope")
        triton.load_model("b")
        assert triton.is_model_ready("b")
        assert {m["state"] for m in _index(triton, protocol)} == {"READY"}
    finally:
        server.stop()


def _json(protocol: str) -> dict:
    return {"as_json": True} if protocol == "grpc" else {}


def _index(triton, protocol: str) -> list[dict]:
    index = triton.get_model_repository_index(**_json(protocol))
    return index["models"] if protocol == "grpc" else index


def test_a_reload_under_load_fails_no_request(
    tmp_path, small_model_dir, other_model_dir, references
):
    """8 clients in a closed loop on model a while version 2 (the other model's weights)
    is loaded: no request fails, every answer is exactly one version's, and once the load
    has returned the answers are version 2's."""
    root = make_repository(tmp_path, small_model_dir, other_model_dir)
    server = ServerThread(None, model_repository=root)
    shutil.copytree(other_model_dir, root / "a" / "2")
    answers: list[tuple[bool, str]] = []  # (after the load returned, which version)
    failures: list[BaseException] = []
    loaded, stop = threading.Event(), threading.Event()
    before, enough_after = threading.Semaphore(0), threading.Semaphore(0)

    def client_loop() -> None:
        with EncoderClient(server.address, ClientOptions(timeout_s=60, retries=0)) as client:
            while not stop.is_set():
                after = loaded.is_set()
                try:
                    out = client.encode(IDS, model="a")
                except grpc.RpcError as exc:
                    failures.append(exc)
                    continue
                answers.append((after, _version_of(out[0].embeddings, references)))
                (enough_after if after else before).release()

    threads = [threading.Thread(target=client_loop) for _ in range(8)]
    try:
        for thread in threads:
            thread.start()
        for _ in range(16):  # the load starts under load
            assert before.acquire(timeout=60)
        triton = triton_grpc.InferenceServerClient(server.address)
        triton.load_model("a")
        loaded.set()
        for _ in range(16):
            assert enough_after.acquire(timeout=60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    try:
        assert failures == []
        assert {version for _, version in answers} == {"1", "2"}
        assert {version for after, version in answers if after} == {"2"}
        index = triton.get_model_repository_index(as_json=True)["models"]
        assert {m["name"]: m["version"] for m in index} == {"a": "2", "b": "1"}
        labels = {"model": "a", "version": "1"}
        assert server.metric("attnserve_tokens_total", labels) == 0  # version 1's series gone
    finally:
        server.stop()


def _version_of(embeddings: np.ndarray, references: dict[str, np.ndarray]) -> str:
    for version, name in (("1", "a"), ("2", "b")):
        ref = references[name]
        if embeddings.shape == ref.shape and np.allclose(embeddings, ref, atol=1e-5, rtol=0):
            return version
    return "neither"


def test_a_failed_load_leaves_the_old_version_serving(
    tmp_path, small_model_dir, other_model_dir, references
):
    root = make_repository(tmp_path, small_model_dir, other_model_dir)
    server = ServerThread(None, model_repository=root, default_model="a")
    broken = root / "a" / "2"
    broken.mkdir()
    (broken / "model.onnx").write_bytes(b"not a model")
    try:
        triton = triton_http.InferenceServerClient(server.http_url.removeprefix("http://"))
        with pytest.raises(InferenceServerException) as error:
            triton.load_model("a")
        assert "model.onnx" in str(error.value)
        (state,) = [m for m in triton.get_model_repository_index() if m["name"] == "a"]
        assert state["state"] == "READY" and state["version"] == "1"
        assert state["reason"].startswith("reload failed")
        with EncoderClient(server.address) as client:
            out = client.encode(IDS, model="a")
        np.testing.assert_allclose(out[0].embeddings, references["a"], atol=1e-5, rtol=0)
    finally:
        server.stop()


def test_several_models_need_a_name_or_a_default(tmp_path, small_model_dir, other_model_dir):
    root = make_repository(tmp_path, small_model_dir, other_model_dir)
    server = ServerThread(None, model_repository=root)
    try:
        with EncoderClient(server.address) as client:
            with pytest.raises(grpc.RpcError) as error:
                client.encode(IDS)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "--default-model" in error.value.details()
            assert client.encode(IDS, model="b")[0].embeddings.shape == (4, OTHER_CONFIG.d_model)
            assert client.model_info(model="a")["d_model"] == SMALL_CONFIG.d_model
    finally:
        server.stop()


def test_the_heap_goes_back_after_each_warm_up_and_each_unload(
    tmp_path, small_model_dir, other_model_dir, monkeypatch
):
    """The heap keeps what answers free until the server idles; what loading, warming up and
    an unloaded model freed is given back at once."""
    calls: list[str] = []
    given = threading.Event()

    def recorder(where: str):
        def give_back_memory() -> bool:
            calls.append(where)
            given.set()
            return True

        return give_back_memory

    monkeypatch.setattr(dataplane, "give_back_memory", recorder("warmed up"))
    monkeypatch.setattr(repository, "give_back_memory", recorder("unloaded"))
    server = ServerThread(
        None, model_repository=make_repository(tmp_path, small_model_dir, other_model_dir)
    )
    try:
        assert calls == ["warmed up", "warmed up"]  # a and b
        given.clear()
        triton_grpc.InferenceServerClient(server.address).unload_model("b")
        assert given.wait(60)
        assert calls == ["warmed up", "warmed up", "unloaded"]
    finally:
        server.stop()
