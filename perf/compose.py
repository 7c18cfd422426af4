"""docker-compose.yml driven for real: `docker compose` where a Docker engine answers,
otherwise podman-compose on podman (deploy/podman-setup.sh prepares it). Used by the
container benchmark and by tests/deploy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from attnserve.client import ClientOptions, EncoderClient

REPO_ROOT = Path(__file__).resolve().parent.parent  # where docker-compose.yml is
BASE_IMAGE = "docker.io/library/python:3.11-slim"
TORCH_WHEEL = "torch-2.13.0+cpu-*.whl"
PODMAN_COMPOSE = [sys.executable, "-m", "podman_compose"]


def _run(cmd: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


def find_engine() -> tuple[str | None, str]:
    """("docker" | "podman", "") when containers can run here, else (None, why not)."""
    if shutil.which("docker") and _run(["docker", "info"]).returncode == 0:
        if _run(["docker", "compose", "version"]).returncode == 0:
            return "docker", ""
        return None, "a Docker engine answers but `docker compose` is missing"
    if not shutil.which("podman"):
        return None, "no container engine (no Docker engine, no podman): `make containers`"
    if _run(["podman", "image", "exists", BASE_IMAGE]).returncode != 0:
        return None, f"podman has no {BASE_IMAGE} image: `make containers` builds one"
    probe = _run(["podman", "run", "--rm", BASE_IMAGE, "true"])
    if probe.returncode != 0:
        return None, f"podman cannot start containers: {probe.stderr.strip()[-300:]}"
    return "podman", ""


def compose_tool() -> list[str] | None:
    """The command that reads and runs compose files here: docker compose, else
    podman-compose (which needs the podman binary even to print a config)."""
    if shutil.which("docker") and _run(["docker", "compose", "version"]).returncode == 0:
        return ["docker", "compose"]
    return PODMAN_COMPOSE if shutil.which("podman") else None


def local_torch_wheels() -> Path | None:
    """A directory with the CPU torch wheel the export image can use instead of downloading
    it: ATTNSERVE_WHEELS_DIR, else a find-links directory of this machine's pip."""
    candidates = [os.environ.get("ATTNSERVE_WHEELS_DIR", "")]
    candidates += os.environ.get("PIP_FIND_LINKS", "").split()
    listed = _run([sys.executable, "-m", "pip", "config", "list"]).stdout
    candidates += [
        line.split("=", 1)[1].strip("'\"")
        for line in listed.splitlines()
        if line.split("=", 1)[0].endswith("find-links")
    ]
    for candidate in filter(None, candidates):
        if any(Path(candidate).glob(TORCH_WHEEL)):
            return Path(candidate)
    return None


def wait_serving(address: str, timeout: float = 300) -> None:
    """Block until the server at `address` reports SERVING (TimeoutError otherwise)."""
    with EncoderClient(address, ClientOptions(retries=0)) as client:
        client.wait_until_serving(timeout)


class ComposeError(RuntimeError):
    """A compose or engine command failed; the message carries its stderr."""


def _checked(result: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if result.returncode != 0:
        raise ComposeError(f"{what}: exit {result.returncode}: {result.stderr[-3000:]}")
    return result


@dataclass
class ComposeProject:
    """One compose project (its own name, containers, volumes and network)."""

    engine: str  # "docker" or "podman"
    name: str
    env: dict[str, str] = field(default_factory=dict)  # the compose file's ${VARIABLES}

    @classmethod
    def on_this_machine(cls, engine: str, name: str, **env: str) -> ComposeProject:
        """A project that publishes on free loopback ports, builds with this machine's
        torch wheel where it has one, and keeps HEALTHCHECK in podman's images."""
        env = {
            "ATTNSERVE_GRPC_PUBLISH": "127.0.0.1:",  # a free host port per replica
            "ATTNSERVE_METRICS_PUBLISH": "127.0.0.1:",
            "ATTNSERVE_HTTP_PUBLISH": "127.0.0.1:",
            "BUILDAH_FORMAT": "docker",  # podman's default OCI format drops HEALTHCHECK
            **env,
        }
        wheels = local_torch_wheels()
        if wheels is not None:  # no multi-GB download: the export image takes this torch
            env.update(ATTNSERVE_WHEELS_DIR=str(wheels), ATTNSERVE_TORCH_INDEX_URL="")
        return cls(engine, name, env)

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        tool = ["docker", "compose"] if self.engine == "docker" else PODMAN_COMPOSE
        result = _run(
            [*tool, "-p", self.name, *args],
            timeout=timeout,
            cwd=REPO_ROOT,
            env={**os.environ, **self.env},
        )
        return _checked(result, f"compose {' '.join(args)}")

    def engine_cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return _run([self.engine, *args], timeout=timeout)

    def containers(self, service: str) -> list[str]:
        """Names of the service's containers (every replica), running or not."""
        result = self.engine_cli(
            "ps", "-a", "--format", "{{.Names}}",
            "--filter", f"label=com.docker.compose.project={self.name}",
            "--filter", f"label=com.docker.compose.service={service}",
        )  # fmt: skip
        return sorted(result.stdout.split())

    def published(self, container: str, port: int) -> str:
        """HOST:PORT on this machine where the container's port is published."""
        result = _checked(self.engine_cli("port", container, str(port)), "port")
        return result.stdout.split()[0].replace("0.0.0.0", "127.0.0.1")

    def inspect(self, container: str, template: str) -> str:
        return self.engine_cli("inspect", "--format", template, container).stdout.strip()

    def volume_path(self, volume: str) -> Path:
        """Where a named volume of this project lives on the host."""
        name = f"{self.name}_{volume}"
        template = "{{.Mountpoint}}"
        result = _checked(self.engine_cli("volume", "inspect", "--format", template, name), name)
        return Path(result.stdout.strip())

    @classmethod
    def leftovers(cls, engine: str, prefix: str) -> list[ComposeProject]:
        """Projects named `prefix`... that still have containers (e.g. of a killed run)."""
        template = '{{index .Labels "com.docker.compose.project"}}'
        names = _run([engine, "ps", "-a", "--format", template]).stdout.split()
        return [cls(engine, name) for name in sorted(set(names)) if name.startswith(prefix)]

    def down(self) -> None:
        """Remove the project's containers, volumes and network: by label, with the engine
        itself, because podman-compose's `down` misses replicas added by --scale."""
        label = f"label=com.docker.compose.project={self.name}"
        for service in ("loadtest", "encoder", "encoder-gpu", "export"):
            names = self.containers(service)
            if names:
                self.engine_cli("rm", "-f", "-t", "15", *names)
        volumes = self.engine_cli("volume", "ls", "-q", "--filter", label).stdout.split()
        if volumes:
            self.engine_cli("volume", "rm", "-f", *volumes)
        self.engine_cli("network", "rm", f"{self.name}_default")
