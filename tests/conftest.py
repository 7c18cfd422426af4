"""Shared fixtures: models are built and exported once per session, then reused."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from attnserve.model.config import ModelConfig
from perf.hf_checkpoints import TEXTS

REPO_ROOT = Path(__file__).resolve().parent.parent

# Small enough to export in seconds, long enough for the lengths the tests need (256).
SMALL_CONFIG = ModelConfig(n_layers=2, n_heads=4, d_model=64, d_ff=256, max_seq_len=300)
SMALL_SEED = 1
# A second model of another shape: the repository's other model, and a's version 2.
OTHER_CONFIG = ModelConfig(
    name="other", n_layers=1, n_heads=2, d_model=32, d_ff=64, max_seq_len=300
)


# What `make test-fast` (pytest -m "not slow") leaves out: containers, the browser, the
# peers' environment (KServe), benchmarks, Ray clusters, and exporting the 4-layer default
# model. A test is slow if it lives in one of these folders or asks for one of these fixtures.
SLOW_FOLDERS = tuple(
    f"tests/{folder}/" for folder in ("deploy", "bench", "perf", "model", "export", "service/ray")
)
SLOW_FIXTURES = {
    "browser",
    "peer_python",
    "circuit_tracer_python",
    "default_export",
    "default_model",
    "hf_dir",
    "families",
}


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        path = Path(item.fspath).relative_to(REPO_ROOT).as_posix()
        if path.startswith(SLOW_FOLDERS) or SLOW_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.slow)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the `attnserve` command (as `python -m attnserve`, this venv's) the way a user would."""
    return subprocess.run(
        [sys.executable, "-m", "attnserve", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


def run_probe(code: str, *args: str, env: dict[str, str] | None = None):
    """What `code`, run in a fresh process with `args` (and `env` added to the environment),
    prints (JSON): for what a process's history changes, such as glibc's heap thresholds."""
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    )
    return json.loads(out.stdout)


@pytest.fixture(scope="session")
def peer_python() -> Path:
    """The python of .venv-peers: KServe, unmodified, in an environment of its own (it pins
    its own versions of much that attnserve uses), made once as the peers benchmark makes it."""
    from perf.peer_env import PEERS_VENV, peer_venv

    return peer_venv(REPO_ROOT / PEERS_VENV, print)


@pytest.fixture(scope="session")
def circuit_tracer_python() -> Path:
    """The python of .venv-circuit-tracer: circuit-tracer 0.5.0, unmodified, with the
    transformers and nnsight it needs (about 5 minutes and 1.6 GB the first time)."""
    from perf.peer_env import CIRCUIT_TRACER, peer_venv

    return peer_venv(REPO_ROOT / CIRCUIT_TRACER.venv, print, CIRCUIT_TRACER.pins, False)


@pytest.fixture(scope="session")
def small_model():
    from attnserve.model.encoder import build_encoder

    return build_encoder(SMALL_CONFIG, seed=SMALL_SEED)


@pytest.fixture(scope="session")
def small_model_dir(small_model, tmp_path_factory) -> Path:
    from attnserve.export.model_dir import write_model_dir

    out = tmp_path_factory.mktemp("small_model")
    write_model_dir(small_model, out, log=lambda _: None, precisions=("fp32", "fp16"))
    return out


@pytest.fixture(scope="session")
def other_model_dir(tmp_path_factory) -> Path:
    from attnserve.export.model_dir import write_model_dir
    from attnserve.model.encoder import build_encoder

    out = tmp_path_factory.mktemp("other_model")
    write_model_dir(build_encoder(OTHER_CONFIG, seed=2), out, log=lambda _: None)
    return out


def make_repository(root: Path, small_model_dir: Path, other_model_dir: Path) -> Path:
    """A model repository in `root`: a, the small model, and b, the other one (version 1)."""
    import shutil

    shutil.copytree(small_model_dir, root / "a" / "1")
    shutil.copytree(other_model_dir, root / "b" / "1")
    return root


@pytest.fixture(scope="module")
def two_models(tmp_path_factory, small_model_dir, other_model_dir):
    """A server of a repository: a (the small model: 2 layers, 4 heads) and b (the other:
    1 layer, 2 heads), a the default."""
    root = make_repository(tmp_path_factory.mktemp("repo"), small_model_dir, other_model_dir)
    server = ServerThread(None, model_repository=root, default_model="a")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def small_runtime(small_model_dir):
    from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions

    return OrtRuntime(small_model_dir, RuntimeOptions(provider="cpu"))


@pytest.fixture(scope="session")
def default_export(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The default model, exported by the real CLI exactly as `make serve` does."""
    out = tmp_path_factory.mktemp("default_model") / "model"
    result = run_cli("export", "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out, result


@pytest.fixture(scope="session")
def default_model():
    """The PyTorch model behind `default_export`: the shipped trained checkpoint."""
    from attnserve.export.cli import DEFAULT_CHECKPOINT
    from attnserve.model.checkpoint import load_checkpoint

    return load_checkpoint(DEFAULT_CHECKPOINT).eval()


def linked_copy(model_dir: Path, out: Path) -> Path:
    """A session's model directory, its files linked into `out`: what is added there (an
    SAE, a transcoder set's backward) leaves the shared one untouched. The weights files
    are copies: a graph added later points into weights.data, and onnx_ir refuses external
    data reached through a link (symbolic or hard)."""
    out.mkdir()
    for path in model_dir.iterdir():
        if path.suffix == ".data":
            shutil.copyfile(path, out / path.name)
        else:
            (out / path.name).symlink_to(path)
    return out


# --- servers -----------------------------------------------------------------


class ServerThread:
    """A real grpc.aio server on port 0, its event loop on a background thread."""

    def __init__(self, model_dir: Path | None, backend=None, warm_up: bool = True, **overrides):
        """model_dir None: give model_repository=DIR among the overrides. A fake `backend`
        runs on the worker threads only: its gate, held on the event loop, would stall it."""
        from attnserve.service.server import start_server
        from attnserve.service.settings import Settings

        if backend is not None:
            overrides = {"inline_max_ms": 0.0, **overrides}
        self.settings = Settings(
            model=model_dir,
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            http_port=0,
            provider="cpu",
            **overrides,
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.running = self.call(start_server(self.settings, backend, warm_up=warm_up))
        self.address = f"127.0.0.1:{self.running.port}"
        self.http_url = f"http://127.0.0.1:{self.running.http_port}"

    def call(self, coroutine, timeout: float = 120):
        """Run a coroutine on the server's loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The sum of a metric's samples whose labels include `labels` (over every model
        and version unless `labels` names them)."""
        wanted = (labels or {}).items()
        return sum(
            sample.value
            for family in self.running.metrics.registry.collect()
            for sample in family.samples
            if sample.name == name and wanted <= sample.labels.items()
        )

    def stop(self, grace: float = 5.0) -> None:
        self.call(self.running.stop(grace))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="session")
def server(small_model_dir, small_runtime):
    """The shared in-process server on the small model (default settings)."""
    running = ServerThread(small_model_dir, small_runtime)
    yield running
    running.stop()


@pytest.fixture
def client(server):
    from attnserve.client import ClientOptions, EncoderClient

    with EncoderClient(server.address, ClientOptions(timeout_s=60)) as c:
        yield c


@pytest.fixture(scope="session")
def cli_server(small_model_dir):
    """`attnserve serve` on the small model, as a subprocess; it must exit 0 on SIGTERM."""
    server = start_cli_server(small_model_dir)
    yield server
    server.process.terminate()
    assert server.process.wait(30) == 0


def start_cli_server(model_dir: Path, *extra: str):
    """`attnserve serve` as a subprocess on a free port, returned once SERVING."""
    from attnserve.service.process import spawn_server

    return spawn_server(model_dir, "--provider", "cpu", *extra, cwd=REPO_ROOT)


# --- Hugging Face GPT-2 (no downloads: built and trained here) ---------------

HF_TEXTS = TEXTS  # the texts every tokenizer of the tests is trained on


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory) -> Path:
    """A tiny random GPT2Model saved with save_pretrained, and a byte-level BPE
    tokenizer trained here with `tokenizers`, as a local Hugging Face directory."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2Model

    directory = tmp_path_factory.mktemp("hf") / "tiny-gpt2"
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(
        HF_TEXTS * 20, vocab_size=400, min_frequency=1, special_tokens=["<|endoftext|>"]
    )
    config = GPT2Config(
        vocab_size=tokenizer.get_vocab_size(),
        n_positions=160,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    GPT2Model(config).eval().save_pretrained(directory)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture(scope="session")
def hf_model_dir(hf_dir, tmp_path_factory) -> Path:
    """The tiny GPT-2 exported by the real CLI."""
    out = tmp_path_factory.mktemp("hf_export") / "model"
    result = run_cli("export", "--from-hf", str(hf_dir), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="session")
def families(tmp_path_factory):
    """Each family's tiny checkpoint and its export (tests/export/families.py)."""
    from tests.export.families import FamilyCheckpoints

    return FamilyCheckpoints(tmp_path_factory.mktemp("families"))


def head_changes(mask) -> list[dict]:
    """A head mask (B, L, H) as each row's change of every hook_z (the plan's SiteChange)."""
    import numpy as np

    from attnserve.service.core.backend import SiteChange

    scales = [np.asarray(row, np.float32)[:, None, :, None] for row in mask]
    return [{"z": SiteChange(scale, np.zeros_like(scale))} for scale in scales]
