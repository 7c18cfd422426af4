"""docker-compose.yml and deploy/kubernetes.yaml, read the way their tools read them and
checked against their specifications and against the service's own settings."""

from __future__ import annotations

import copy
import os
import re
import subprocess

import kubernetes_validate
import pytest
import yaml
from compose_spec import PyCompose

from attnserve.service.settings import Settings, env_name
from perf.compose import compose_tool
from tests.ci import skip_or_fail_in_ci
from tests.conftest import REPO_ROOT

SETTINGS_ENV = {env_name(name) for name in Settings.__dataclass_fields__}
ALL_PROFILES = ("gpu", "loadtest", "monitoring")
KUBERNETES = REPO_ROOT / "deploy" / "kubernetes.yaml"


def resolved_compose(*profiles: str, env: dict[str, str] | None = None) -> str:
    """`compose config`: variables substituted, merge keys and profiles applied."""
    tool = compose_tool()
    if tool is None:
        skip_or_fail_in_ci("neither docker compose nor podman-compose can read compose files")
    args = [arg for profile in profiles for arg in ("--profile", profile)]
    result = subprocess.run(
        [*tool, *args, "config"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("profiles", [(), ALL_PROFILES], ids=["default", "all-profiles"])
def test_compose_file_resolves_to_a_valid_compose_spec_document(profiles):
    text = resolved_compose(*profiles)
    expected = {"export", "encoder"}
    if profiles:
        expected |= {"encoder-gpu", "loadtest", "prometheus"}
    assert set(PyCompose.from_yaml(text).service_names()) == expected


def test_compose_spec_check_rejects_what_compose_would():
    text = resolved_compose(*ALL_PROFILES)
    for good, bad in [
        ("restart: unless-stopped", "restart: sometimes"),
        ("stop_grace_period: 15s", "stop_grace_periodd: 15s"),
        ("condition: service_completed_successfully", "condition: exported"),
    ]:
        assert good in text
        with pytest.raises(ValueError):
            PyCompose.from_yaml(text.replace(good, bad))


def test_compose_variables_reach_the_services():
    text = resolved_compose(
        "loadtest", env={"ATTNSERVE_GRPC_PUBLISH": "127.0.0.1:7000", "ATTNSERVE_MAX_QUEUE": "9"}
    )
    services = yaml.safe_load(text)["services"]
    ports = [str(p) for p in services["encoder"]["ports"]]
    assert any(re.fullmatch(r"127\.0\.0\.1:7000:50051(/tcp)?", p) for p in ports), ports
    assert str(services["encoder"]["environment"]["ATTNSERVE_MAX_QUEUE"]) == "9"


def test_compose_encoders_use_real_settings_and_outlast_their_grace():
    services = yaml.safe_load(resolved_compose("gpu"))["services"]
    for name, provider in [("encoder", "cpu"), ("encoder-gpu", "cuda")]:
        service = services[name]
        environment = service["environment"]
        assert set(environment) <= SETTINGS_ENV, set(environment) - SETTINGS_ENV
        assert environment["ATTNSERVE_PROVIDER"] == provider
        grace = float(environment["ATTNSERVE_GRACE_SECONDS"])
        assert _seconds(service["stop_grace_period"]) > grace
        assert service["depends_on"]["export"]["condition"] == "service_completed_successfully"
        assert "health" in " ".join(service["healthcheck"]["test"])
    reservation = services["encoder-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert reservation["driver"] == "nvidia" and "gpu" in reservation["capabilities"]


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", str(duration))
    assert match, duration
    return float(match.group(1)) * {"ms": 1e-3, "s": 1, "m": 60}[match.group(2)]


def _kubernetes_documents() -> list[dict]:
    return list(yaml.safe_load_all(KUBERNETES.read_text()))


def _validate(document: dict) -> None:
    kubernetes_validate.validate(document, desired_version="1.30.0", strict=True)


def test_kubernetes_manifest_passes_strict_schema_validation():
    for document in _kubernetes_documents():
        _validate(document)
    deployment = next(d for d in _kubernetes_documents() if d["kind"] == "Deployment")
    broken = copy.deepcopy(deployment)
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grcp"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(broken)


def test_kubernetes_probes_ports_and_settings_agree():
    service, deployment = _kubernetes_documents()
    pod = deployment["spec"]["template"]["spec"]
    (encoder,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in encoder["ports"]}
    assert ports == {
        "grpc": Settings.port,
        "http": Settings.http_port,
        "metrics": Settings.metrics_port,
    }
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert encoder[probe]["grpc"]["port"] == ports["grpc"]  # grpc.health.v1
    environment = {e["name"]: e["value"] for e in encoder["env"]}
    assert set(environment) <= SETTINGS_ENV, set(environment) - SETTINGS_ENV
    pre_stop = int(encoder["lifecycle"]["preStop"]["exec"]["command"][-1])
    grace = float(environment["ATTNSERVE_GRACE_SECONDS"])
    assert pod["terminationGracePeriodSeconds"] > pre_stop + grace
    # Headless: DNS gives clients every pod, for gRPC's round_robin.
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
