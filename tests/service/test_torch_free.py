"""The serving path and the client must import on a machine without torch (the image has none)."""

import pkgutil
import subprocess
import sys

import attnserve.client
import attnserve.service
import attnserve.v1
from tests.conftest import REPO_ROOT

# Everything of these packages, found by walking them (a new module is covered without a
# list to keep): the model modules the serving path needs come in through their imports.
SERVING_PACKAGES = (attnserve.service, attnserve.client, attnserve.v1)


def serving_modules() -> list[str]:
    names = ["attnserve", "attnserve.cli", "attnserve.model"]
    for package in SERVING_PACKAGES:
        names.append(package.__name__)
        names += [m.name for m in pkgutil.walk_packages(package.__path__, package.__name__ + ".")]
    return names


def test_the_module_walk_finds_the_serving_path():
    names = serving_modules()
    for expected in (
        "attnserve.service.core.engine",
        "attnserve.client.codec",
        "attnserve.v1.wire",
    ):
        assert expected in names


def test_serving_path_imports_without_torch():
    # sys.modules["torch"] = None makes any `import torch` raise ImportError,
    # exactly as on a machine where torch is not installed.
    code = (
        "import sys, importlib\n"
        "sys.modules['torch'] = None\n"
        f"for name in {serving_modules()!r}:\n"
        "    importlib.import_module(name)\n"
        "from attnserve.cli import parser\n"
        "parser()\n"  # every subcommand registers without torch
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_blocking_torch_really_blocks_it():
    """Guards the test above: the same trick must make the torch-based modules fail."""
    code = "import sys; sys.modules['torch'] = None; import attnserve.model.encoder"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "ImportError" in result.stderr or "ModuleNotFoundError" in result.stderr


def test_service_never_imports_the_client():
    """The wire format belongs to neither end: the server must not depend on its client."""
    modules = sorted((REPO_ROOT / "service").rglob("*.py"))
    assert REPO_ROOT / "service" / "core" / "dataplane.py" in modules
    for path in modules:
        assert "attnserve.client" not in path.read_text(), path


# The seam and what stands on it, and everything the container's probe (`attnserve health`,
# every 10 s) loads: none of it may load the engine.
ENGINE_FREE = (
    "attnserve.service.core.backend",
    "attnserve.service.core.engine",
    "attnserve.service.core.plan",
    "attnserve.service.core.budget",
    "attnserve.service.core.dataplane",
    "attnserve.service.settings",
    "tests.service.fakes",
)
BLOCK_ENGINE = (
    "import sys\nfor name in ('onnxruntime', 'onnx', 'torch'):\n    sys.modules[name] = None\n"
)


def test_the_seam_and_the_health_probe_load_no_engine():
    code = BLOCK_ENGINE + (
        f"import importlib\nfor name in {ENGINE_FREE!r}:\n    importlib.import_module(name)\n"
        "from attnserve.cli import main\n"
        "sys.exit(main(['health', '--target', '127.0.0.1:1', '--timeout', '0.5']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 1, result.stderr  # not SERVING: nothing listens there
    assert "UNAVAILABLE" in result.stderr


def test_blocking_the_engine_really_blocks_it():
    code = BLOCK_ENGINE + "import attnserve.service.ort.runtime"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr
