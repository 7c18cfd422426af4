"""Start `python -m service` as a child process and learn the ports it bound."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

_LISTENING = re.compile(r"listening: .* on ([\d.]+):(\d+).*metrics on (?:port (\d+)|\(off\))")


@dataclass
class ServerProcess:
    process: subprocess.Popen
    address: str  # HOST:PORT of the gRPC server
    metrics_port: int | None  # the /metrics port, when on

    def metric(self, name: str) -> float:
        """One unlabelled sample from /metrics (0 when absent)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0


def spawn_server(
    model_dir: Path, *extra: str, cwd: Path | None = None, timeout: float = 120
) -> ServerProcess:
    """The server on 127.0.0.1, any free port (metrics off unless `extra` turns them on).

    The log is drained on a thread once the ports are known, so the child never
    blocks on a full pipe.
    """
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service",
            "--model",
            str(model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--metrics-port",
            "-1",
            *extra,
        ],
        cwd=cwd,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + timeout
    lines = []
    for line in process.stderr:
        lines.append(line)
        if match := _LISTENING.search(line):
            threading.Thread(target=process.stderr.read, daemon=True).start()
            metrics_port = int(match.group(3)) if match.group(3) else None
            return ServerProcess(process, f"{match.group(1)}:{match.group(2)}", metrics_port)
        if time.monotonic() > deadline:
            break
    process.kill()
    raise RuntimeError("the server did not start:\n" + "".join(lines))
