"""Shared fixtures: models are built and exported once per session, then reused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from model.config import ModelConfig

REPO_ROOT = Path(__file__).resolve().parent.parent

# Small enough to export in seconds, long enough for the lengths the tests need (256).
SMALL_CONFIG = ModelConfig(n_layers=2, n_heads=4, d_model=64, d_ff=256, max_seq_len=300)
SMALL_SEED = 1


def run_module(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `python -m ...` from the repo root the way a user would."""
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=600,
    )


@pytest.fixture(scope="session")
def small_model():
    from model.encoder import build_encoder

    return build_encoder(SMALL_CONFIG, seed=SMALL_SEED)


@pytest.fixture(scope="session")
def small_model_dir(small_model, tmp_path_factory) -> Path:
    from export.model_dir import write_model_dir

    out = tmp_path_factory.mktemp("small_model")
    write_model_dir(small_model, out, log=lambda _: None)
    return out


@pytest.fixture(scope="session")
def small_runtime(small_model_dir):
    from service.runtime import OrtRuntime, RuntimeOptions

    return OrtRuntime(small_model_dir, RuntimeOptions(provider="cpu"))


@pytest.fixture(scope="session")
def default_export(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The default model, exported by the real CLI exactly as `make serve` does."""
    out = tmp_path_factory.mktemp("default_model") / "model"
    result = run_module("export", "--out", str(out), "--seed", "0")
    assert result.returncode == 0, result.stderr
    return out, result


@pytest.fixture(scope="session")
def default_model():
    from model.encoder import build_encoder

    return build_encoder(ModelConfig(), seed=0)
