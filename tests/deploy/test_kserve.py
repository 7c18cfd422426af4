"""deploy/kserve.yaml, checked against KServe's published API types (the kserve package in
.venv-peers, with the kubernetes client it builds on) and against the service's settings."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from attnserve.service.settings import Settings, env_name
from tests.conftest import REPO_ROOT

MANIFEST = REPO_ROOT / "deploy" / "kserve.yaml"
CHECK = Path(__file__).with_name("kserve_schema_check.py")


def schema_check(python: Path, manifest: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), str(CHECK), str(manifest)], capture_output=True, text=True, timeout=120
    )


def test_the_inference_service_fits_kserves_api_types(peer_python):
    result = schema_check(peer_python, MANIFEST)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_refuses_a_field_kserve_does_not_have(peer_python, tmp_path):
    bad = tmp_path / "kserve.yaml"
    bad.write_text(MANIFEST.read_text().replace("maxReplicas:", "maxReplica:"))
    result = schema_check(peer_python, bad)
    assert result.returncode == 1
    assert ".spec.predictor.maxReplica: not a field of V1beta1PredictorSpec" in result.stdout


def test_the_predictor_serves_v2_over_grpc_on_the_servers_port():
    document = yaml.safe_load(MANIFEST.read_text())
    (container,) = document["spec"]["predictor"]["containers"]
    (port,) = container["ports"]
    assert port == {"name": "h2c", "containerPort": Settings.port, "protocol": "TCP"}
    assert container["readinessProbe"]["grpc"]["port"] == Settings.port
    settings = {env_name(name) for name in Settings.__dataclass_fields__}
    assert {e["name"] for e in container["env"]} <= settings
