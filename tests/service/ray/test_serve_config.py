"""deploy/ray/serve.yaml under `serve run`, as the docs say to run it: Ray starts itself, the
application serves HTTP and gRPC with the direct server's answers, and Ctrl-C stops it."""

from __future__ import annotations

import os
import signal
import subprocess

import httpx
import numpy as np
import pytest
import yaml

from attnserve.client import EncoderClient
from tests.conftest import REPO_ROOT
from tests.service.ray.test_ray_serve import IDS, free_port, wait_for

pytest.importorskip("ray", reason="the ray extra: `make install` has it")

from attnserve.service.ray.app import (
    GRACEFUL_SHUTDOWN_S,
    GRPC_SERVICERS,
    REPLICA_ENV,
    actor_options,
)

SHIPPED = REPO_ROOT / "deploy" / "ray" / "serve.yaml"


def test_the_shipped_config_registers_the_servicers_the_app_serves():
    config = yaml.safe_load(SHIPPED.read_text())
    assert config["grpc_options"]["grpc_servicer_functions"] == GRPC_SERVICERS


def test_the_shipped_config_overrides_nothing_the_app_sets():
    """Where the deployment in app.py sets an option, the YAML says nothing else (it once set
    a 20 s graceful shutdown that undid the app's 60 s: long texts cut at a scale-down)."""
    application = yaml.safe_load(SHIPPED.read_text())["applications"][0]
    deployment = application["deployments"][0]
    for key, value in application.get("runtime_env", {}).get("env_vars", {}).items():
        assert REPLICA_ENV.get(key, value) == value, key
    shutdown = deployment.get("graceful_shutdown_timeout_s", GRACEFUL_SHUTDOWN_S)
    assert shutdown == GRACEFUL_SHUTDOWN_S
    for key, value in deployment.get("ray_actor_options", {}).items():
        assert actor_options().get(key, value) == value, key


def test_serve_run_serves_the_shipped_config(tmp_path, small_model_dir, client):
    """`serve run deploy/ray/serve.yaml` (the model and ports changed for the test) serves
    HTTP and gRPC with the direct server's answers; Ctrl-C stops it."""
    config = yaml.safe_load(SHIPPED.read_text())
    ports = {"http": free_port(), "grpc": free_port()}
    config["http_options"] |= {"host": "127.0.0.1", "port": ports["http"]}
    config["grpc_options"]["port"] = ports["grpc"]
    config["applications"][0]["args"]["model"] = str(small_model_dir)
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    serve_bin = REPO_ROOT / ".venv" / "bin" / "serve"
    process = subprocess.Popen(
        [str(serve_bin), "run", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: _healthy(ports["http"]), "serve run to serve", timeout=180)
        expected = client.encode(IDS)[0].embeddings
        with EncoderClient(f"127.0.0.1:{ports['grpc']}") as c:
            got = c.encode(IDS)[0].embeddings
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    finally:
        os.killpg(process.pid, signal.SIGINT)
        try:  # the subject is serving: a shutdown slowed by a loaded machine is not a failure
            process.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
