"""The peers' own environment: KServe's model server and tritonclient, run by
kserve_peer.py in a virtual environment of their own (their pins differ from the
project's), and driven from here one JSON line at a time.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions, session_settings

PEERS_VENV = Path(".venv-peers")  # made once, beside the project's .venv
KSERVE_PINS = ("kserve==0.21.0", "tritonclient[grpc,http]==2.73.0")
PEER_SCRIPT = Path(__file__).with_name("kserve_peer.py")  # the only code that runs there


def peer_venv(path: Path, log: Callable[[str], None]) -> Path:
    """KServe, tritonclient and this environment's ONNX Runtime in a virtual environment of
    their own (made once; a stamp file names what it holds). Returns its python."""
    ort = ort_distribution()
    pins = [*KSERVE_PINS, f"{ort}=={metadata.version(ort)}"]
    python, stamp = path / "bin" / "python", path / "pins.txt"
    if stamp.is_file() and stamp.read_text().split() == pins:
        return python
    log(f"peers: installing {' '.join(pins)} into {path} (a minute or two)")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *pins], check=True)
    stamp.write_text("\n".join(pins) + "\n")
    return python


def ort_distribution() -> str:
    """The ONNX Runtime distribution of this environment (the peers get the same one)."""
    for distribution in ("onnxruntime-gpu", "onnxruntime"):
        try:
            metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
        return distribution
    raise RuntimeError("no ONNX Runtime installed: pip install 'attnserve[cpu]'")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TritonDriver:
    """A tritonclient process (kserve_peer.py's client side) pointed at a V2 server on
    127.0.0.1:`port`: `ask` sends it one operation and returns its answer."""

    def __init__(self, python: Path, port: int, model: str | None = None) -> None:
        command = [str(python), str(PEER_SCRIPT), "client", "--port", str(port)]
        command += ["--model", model] if model else []
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def ask(self, op: str, **arguments) -> dict:
        self.process.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def ready(self) -> bool:
        """Whether the server answered ModelReady within 120 s."""
        return self.ask("ready")["ready"]

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)


class KServePeer:
    """KServe serving `model_dir`, and a tritonclient process that measures it on command."""

    def __init__(self, python: Path, model_dir: Path, runtime: OrtRuntime) -> None:
        port = _free_port()
        session = {
            **session_settings(RuntimeOptions(provider="cpu")),
            "attention_graph": runtime.attention_graph.name,  # the graph attnserve runs
        }
        serve = ["serve", "--model-dir", str(model_dir), "--port", str(port)]
        serve += ["--http-port", str(_free_port()), "--session", json.dumps(session)]
        self.server = subprocess.Popen(
            [str(python), str(PEER_SCRIPT), *serve],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.client = TritonDriver(python, port)
        if not self.client.ready():
            self.close()
            raise RuntimeError("KServe's model server did not become ready in 120 s")

    def ask(self, op: str, **arguments) -> dict:
        return self.client.ask(op, **arguments)

    def close(self) -> None:
        self.client.close()
        self.server.terminate()
        self.server.wait(30)
