"""The compose stack for real: images built, the one-shot export, the encoder healthy and
answering through its published port, the loadtest profile, --scale encoder=2 behind
round_robin, and a graceful SIGTERM. The tests run in order on one stack."""

from __future__ import annotations

import json
import os
import threading
import time

import grpc
import httpx
import numpy as np
import pytest

from attnserve.client import ClientOptions, EncoderClient
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from attnserve.service.process import metric_total
from perf.compose import ComposeProject, find_engine, wait_serving
from tests.ci import skip_or_fail_in_ci

READY_TIMEOUT_S = 300
PROJECT_PREFIX = "attnserve-test-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's
        pass
    return True


def _run_loadtest(stack: ComposeProject) -> dict:
    """The loadtest profile's container, to completion; its report from the reports volume."""
    stack.compose("--profile", "loadtest", "run", "--rm", "loadtest", timeout=300)
    return json.loads((stack.volume_path("reports") / "load.json").read_text())["summary"]


def _encode_requests(address: str) -> float:
    return metric_total(
        f"http://{address}/metrics", "attnserve_requests_total", method="Encode", code="OK"
    )


@pytest.fixture(scope="module")
def stack():
    engine, why_not = find_engine()
    if engine is None:
        skip_or_fail_in_ci(why_not)
    for stale in ComposeProject.leftovers(engine, PROJECT_PREFIX):
        if not _alive(int(stale.name.removeprefix(PROJECT_PREFIX))):  # a run killed mid-test
            stale.down()
    project = ComposeProject.on_this_machine(
        engine, f"{PROJECT_PREFIX}{os.getpid()}", ATTNSERVE_TAG="test", ATTNSERVE_LOAD_DURATION="5"
    )
    try:
        project.compose("build", timeout=1800)
        project.compose("up", "-d", "encoder", timeout=900)
        yield project
    finally:
        project.down()


@pytest.fixture(scope="module")
def encoder(stack) -> str:
    """The first encoder replica's container name, once it is SERVING."""
    (name,) = stack.containers("encoder")
    wait_serving(stack.published(name, 50051))
    return name


def test_export_then_encode_through_the_published_port(stack, encoder):
    model_dir = stack.volume_path("models") / "default"
    (export,) = stack.containers("export")
    assert stack.inspect(export, "{{.State.ExitCode}}") == "0"
    ids = list(range(3, 200))
    with EncoderClient(stack.published(encoder, 50051)) as client:
        (served,) = client.encode([ids])
        info = client.model_info()
    # The same model file, run here on the host, gives the same numbers.
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    expected, _ = runtime.run(np.array([ids]))
    np.testing.assert_allclose(served.embeddings, expected[0], atol=1e-5)
    assert (info["version"], info["provider"]) == (runtime.version, "cpu")
    # The HTTP port is published too: OpenAI-style embeddings of the same model.
    url = "http://" + stack.published(encoder, 8080)
    response = httpx.post(url + "/v1/embeddings", json={"input": [ids]}, timeout=30)
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["data"][0]["embedding"], expected[0][-1], atol=1e-5)


def test_image_healthcheck_asks_the_grpc_health_service(stack, encoder):
    if stack.engine == "podman":  # no systemd here to schedule it: run it once by hand
        result = stack.engine_cli("healthcheck", "run", encoder)
        assert result.returncode == 0, result.stdout + result.stderr
    deadline = time.monotonic() + READY_TIMEOUT_S
    while stack.inspect(encoder, "{{.State.Health.Status}}") != "healthy":
        assert time.monotonic() < deadline, "never healthy"
        time.sleep(1)


def test_runtime_image_is_light_and_not_root(stack, encoder):
    image = stack.inspect(encoder, "{{.Config.Image}}")
    probe = (
        "import importlib.util as u, os, shutil; "
        "print(u.find_spec('torch'), shutil.which('gcc'), shutil.which('cc'), os.getuid(), "
        "[n for n in ('model', 'service', 'client', 'export', 'bench') if u.find_spec(n)], "
        "shutil.which('attnserve'))"
    )
    result = stack.engine_cli(
        "run", "--rm", "--workdir", "/tmp", "--entrypoint", "python", image, "-c", probe
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "None",
        "None",
        "None",
        "10001",
        "[]",
        "/opt/venv/bin/attnserve",
    ]


def test_loadtest_profile_completes_without_errors(stack, encoder):
    summary = _run_loadtest(stack)
    assert summary["requests"] > 20
    assert summary["ok"] == summary["requests"] and summary["errors"] == {}


def test_scale_out_spreads_requests_over_both_replicas(stack, encoder):
    stack.compose("up", "-d", "--scale", "encoder=2", "encoder", timeout=600)
    replicas = stack.containers("encoder")
    assert len(replicas) == 2
    for name in replicas:
        wait_serving(stack.published(name, 50051))
    metrics = [stack.published(name, 9464) for name in replicas]
    before = [_encode_requests(address) for address in metrics]
    summary = _run_loadtest(stack)
    served = [_encode_requests(address) - b for address, b in zip(metrics, before, strict=True)]
    assert summary["errors"] == {} and sum(served) == summary["ok"]
    # round_robin over the service's DNS name: each replica takes about half.
    assert min(served) >= 0.3 * summary["ok"], served


def test_sigterm_drains_in_flight_requests_and_exits_0(stack, encoder):
    address = stack.published(encoder, 50051)
    metrics = f"http://{stack.published(encoder, 9464)}/metrics"
    client = EncoderClient(address, ClientOptions(retries=0, timeout_s=120))
    results, errors = [], []

    def call():
        try:
            results.append(client.encode([[1] * 1024] * 4))
        except grpc.RpcError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while metric_total(metrics, "attnserve_requests_in_flight") < len(threads):
        assert time.monotonic() < deadline and not results, "requests never all in flight"
        time.sleep(0.01)
    # `stop` sends the image's stop signal (SIGTERM) and waits 15 s before any SIGKILL.
    stopped = stack.engine_cli("stop", "-t", "15", encoder)
    for t in threads:
        t.join(60)
    assert stopped.returncode == 0, stopped.stderr
    assert errors == [] and len(results) == len(threads)
    assert stack.inspect(encoder, "{{.State.ExitCode}}") == "0"  # drained, not killed (137)
    logs = stack.engine_cli("logs", encoder)
    assert "draining" in logs.stdout + logs.stderr
