"""The serving path and the client must import on a machine without torch (the image has none)."""

import subprocess
import sys

from tests.conftest import REPO_ROOT

SERVING_MODULES = [
    "service",
    "service.runtime",
    "service.settings",
    "service.errors",
    "service.status",
    "service.batcher",
    "service.encoding",
    "service.servicer",
    "service.server",
    "service.metrics",
    "service.auth",
    "service.__main__",
    "client",
    "client.client",
    "client.codec",
    "client.tensors",
    "client.__main__",
    "model",
    "model.config",
    "model.tokenizer",
    "model.artifacts",
]


def test_serving_path_imports_without_torch():
    # sys.modules["torch"] = None makes any `import torch` raise ImportError,
    # exactly as on a machine where torch is not installed.
    code = (
        "import sys, importlib\n"
        "sys.modules['torch'] = None\n"
        f"for name in {SERVING_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_blocking_torch_really_blocks_it():
    """Guards the test above: the same trick must make the torch-based modules fail."""
    code = "import sys; sys.modules['torch'] = None; import model.encoder"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "ImportError" in result.stderr or "ModuleNotFoundError" in result.stderr
