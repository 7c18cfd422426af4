"""The peers' own environments: KServe's model server and tritonclient (kserve_peer.py),
MLServer (mlserver_peer.py) and PyTriton (pytriton_peer.py), each in a virtual environment
of its own (their pins differ from the project's and from each other's), with the
project's ONNX Runtime. tritonclient, from KServe's environment, measures every one of
them over the Open Inference Protocol, driven from here one JSON line at a time.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from attnserve.service.core.memory import KEEP_FREED_HEAP_ENV
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from attnserve.service.ort.sessions import session_settings

PEERS_VENV = Path(".venv-peers")  # made once, beside the project's .venv
KSERVE_PINS = ("kserve==0.21.0", "tritonclient[grpc,http]==2.73.0")
PEER_SCRIPT = Path(__file__).with_name("kserve_peer.py")  # the tritonclient driver too


@dataclass(frozen=True)
class PeerKind:
    """A server a user would pick instead: its name, environment, pins and serving script
    (`serve --model-dir --port --http-port --session`)."""

    name: str
    venv: Path  # relative: beside the project's .venv
    pins: tuple[str, ...]
    script: Path


KSERVE = PeerKind("KServe", PEERS_VENV, KSERVE_PINS, PEER_SCRIPT)
MLSERVER = PeerKind(
    "MLServer",
    Path(".venv-mlserver"),
    ("mlserver==1.7.1",),
    PEER_SCRIPT.with_name("mlserver_peer.py"),
)
PYTRITON = PeerKind(
    "PyTriton",
    Path(".venv-pytriton"),
    ("nvidia-pytriton==0.7.0",),
    PEER_SCRIPT.with_name("pytriton_peer.py"),
)
PEERS = (KSERVE, MLSERVER, PYTRITON)
# circuit-tracer, the attribution graphs' reference (tests/service/circuits, `perf graphs`):
# its nnsight backend loads a local checkpoint offline, with nnsight 0.7 (0.8 breaks it)
CIRCUIT_TRACER = PeerKind(
    "circuit-tracer",
    Path(".venv-circuit-tracer"),
    ("torch==2.13.0", "circuit-tracer==0.5.0", "transformers==4.57.3", "nnsight==0.7.0"),
    PEER_SCRIPT.with_name("circuit_tracer_peer.py"),
)


def peer_venv(
    path: Path,
    log: Callable[[str], None],
    pins: tuple[str, ...] = KSERVE_PINS,
    same_runtime: bool = True,
) -> Path:
    """`pins` and (`same_runtime`) this environment's ONNX Runtime in a virtual environment of
    their own (made once; a stamp file names what it holds). Returns its python."""
    if same_runtime:
        ort = ort_distribution()
        pins = (*pins, f"{ort}=={metadata.version(ort)}")
    python, stamp = path / "bin" / "python", path / "pins.txt"
    if stamp.is_file() and stamp.read_text().split() == list(pins):
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


def _with_this_libpython() -> dict[str, str]:
    """This environment, with this Python's own libpython first on the loader's path: Triton's
    Python backend stub (PyTriton) links libpython3.X dynamically, and the system's copy may be
    older than the standard library of the venv it runs (a pyenv Python, say)."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    paths = [libdir, *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]
    return {**os.environ, "LD_LIBRARY_PATH": ":".join(paths)}


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
        self.process = subprocess.Popen(  # a client's heap, as attnserve's client keeps it
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **KEEP_FREED_HEAP_ENV},
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


class Peer:
    """A peer (`kind`, run by its environment's `python`) serving `model_dir`, and a
    tritonclient process (`driver`: the python of KServe's environment) that measures it
    on command."""

    def __init__(
        self,
        kind: PeerKind,
        python: Path,
        model_dir: Path,
        runtime: OrtRuntime,
        driver: Path | None = None,
    ) -> None:
        self.kind = kind
        port = _free_port()
        session = {
            **session_settings(RuntimeOptions(provider="cpu")),
            "attention_graph": runtime.attention_graph.name,  # the graph attnserve runs
        }
        serve = ["serve", "--model-dir", str(model_dir), "--port", str(port)]
        serve += ["--http-port", str(_free_port()), "--session", json.dumps(session)]
        self.server = subprocess.Popen(
            [str(python), str(kind.script), *serve],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=_with_this_libpython(),
        )
        self.client = TritonDriver(driver or python, port)
        if not self.client.ready():
            self.close()
            raise RuntimeError(f"{kind.name} did not become ready in 120 s")

    def ask(self, op: str, **arguments) -> dict:
        return self.client.ask(op, **arguments)

    def close(self) -> None:
        self.client.close()
        self.server.terminate()
        self.server.wait(30)
