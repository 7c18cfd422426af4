"""Start `python -m service` as a child process and learn the port it bound."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

_LISTENING = re.compile(r"listening: .* on ([\d.]+):(\d+)")


def spawn_server(
    model_dir: Path, *extra: str, cwd: Path | None = None, timeout: float = 120
) -> tuple[subprocess.Popen, str]:
    """The server on 127.0.0.1, any free port; returns the process and HOST:PORT.

    The log is drained on a thread once the port is known, so the child never
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
            return process, f"{match.group(1)}:{match.group(2)}"
        if time.monotonic() > deadline:
            break
    process.kill()
    raise RuntimeError("the server did not start:\n" + "".join(lines))
