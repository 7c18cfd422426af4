"""Start `attnserve serve` as a child process and wait until it is SERVING.

Readiness comes from the server's own ready file (written once the model is
warm, holding the bound ports), not from its log. Used by the benchmarks and
the tests; handy for anyone's integration tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class ServerProcess:
    process: subprocess.Popen
    address: str  # HOST:PORT of the gRPC server
    metrics_port: int | None  # the /metrics port, when on
    http_port: int | None  # the HTTP API's port, when on
    log_path: Path  # the server's stderr

    def metric(self, name: str, **labels: str) -> float:
        """A metric from /metrics, summed over every model and version (and any label
        `labels` leaves open); 0 when absent."""
        return metric_total(f"http://127.0.0.1:{self.metrics_port}/metrics", name, **labels)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def metric_total(url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples at a /metrics URL whose labels include `labels`."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def spawn_server(
    model_dir: Path | None,
    *extra: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> ServerProcess:
    """The server of `model_dir` (None: `extra` gives --model-repository) on 127.0.0.1, any
    free ports (metrics off unless `extra` turns them on), returned once it is SERVING.
    RuntimeError, with its log, if it exits or times out first. `env`: the child's whole
    environment (default: this process's)."""
    scratch = Path(tempfile.mkdtemp(prefix="attnserve-"))
    ready_file, log_path = scratch / "ready.json", scratch / "server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "attnserve",
                "serve",
                *(["--model", str(model_dir)] if model_dir is not None else []),
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--metrics-port",
                "-1",
                "--http-port",
                "0",
                "--ready-file",
                str(ready_file),
                *extra,
            ],
            cwd=cwd,
            env=env,
            stderr=log,
        )
    deadline = time.monotonic() + timeout
    while not ready_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise RuntimeError("the server did not start:\n" + log_path.read_text())
        time.sleep(0.05)
    ready = json.loads(ready_file.read_text())
    return ServerProcess(
        process,
        f"127.0.0.1:{ready['port']}",
        ready["metrics_port"],
        ready["http_port"],
        log_path,
    )
