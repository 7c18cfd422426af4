"""The installed distribution claims only `attnserve*` names and installs the one command."""

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """The wheel, built from a clean copy of the checkout's files (setuptools would reuse
    and never prune a build/ folder left in the tree), and what the build printed."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        if (REPO_ROOT / name).is_symlink():  # attnserve/service -> ../service, ...
            os.symlink(os.readlink(REPO_ROOT / name), source / name)
        elif (REPO_ROOT / name).is_file():
            shutil.copy2(REPO_ROOT / name, source / name)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--verbose",  # the build backend's warnings too
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    (path,) = out.glob("attnserve-*.whl")
    return path, result.stdout + result.stderr


@pytest.fixture(scope="module")
def wheel(built) -> Path:
    return built[0]


def test_the_build_warns_about_nothing(built):
    """The data folders are declared packages: setuptools has nothing to say about them
    (it printed ~80 lines of "Package would be ignored" for each `make serve` before)."""
    assert "would be ignored" not in built[1] and "is absent from the" not in built[1]


def test_the_wheel_has_one_top_level_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {
        name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")
    }
    assert top_level == {"attnserve"}
    for package in ("v1", "oip", "model", "export", "service", "client", "bench"):
        assert f"attnserve/{package}/__init__.py" in names
    assert "attnserve/v1/wire.py" in names
    assert "attnserve/oip/grpc_service_pb2.py" in names
    # Data files: the explorer page, and the default model's weights (what `export` reads).
    assert "attnserve/service/http/static/explorer/index.html" in names
    assert "attnserve/model/pretrained/default.safetensors" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "attnserve = attnserve.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_every_package_of_the_tree_is_in_the_wheel(wheel):
    """pyproject.toml lists the packages: a new folder left off the list would be missing
    from every install and present in every checkout."""
    names = set(zipfile.ZipFile(wheel).namelist())
    root = REPO_ROOT / "attnserve"
    packages = {
        (Path(folder) / "__init__.py").relative_to(REPO_ROOT).as_posix()
        for folder, _, files in os.walk(root, followlinks=True)
        if "__init__.py" in files and "__pycache__" not in folder
    }
    assert "attnserve/service/v1/__init__.py" in packages
    assert packages - names == set()


def test_installed_without_the_repo_nothing_generic_is_importable(wheel, tmp_path):
    """A fresh venv, `pip install --no-deps` of the wheel: attnserve.* is there, `model`,
    `service`, `client`, `export`, `bench`, `perf` (the suite beside the package) and
    `protos` are not."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)  # ensurepip: offline
    python = env_dir / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
        check=True,
    )
    code = (
        "import importlib.util as u\n"
        "generic = ['model', 'service', 'client', 'export', 'bench', 'perf', 'protos']\n"
        "print(sorted(n for n in generic if u.find_spec(n)))\n"
        "print(bool(u.find_spec('attnserve.client')), bool(u.find_spec('attnserve.v1')))\n"
    )
    result = subprocess.run(
        [python, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert result.stdout.split("\n")[:2] == ["[]", "True True"]


def test_from_the_repo_root_a_regular_install_imports_the_same_files(wheel, tmp_path):
    """The root folder `attnserve/` shadows the installed package there; its symlinks make
    it the whole package, so `import attnserve.service` still works (and names the file)."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", str(wheel)],
        check=True,
    )
    code = "import attnserve.service, attnserve.oip; print(attnserve.service.__path__[0])"
    result = subprocess.run([python, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(REPO_ROOT / "attnserve" / "service")


def test_imports_resolve_without_an_import_hook():
    """What a static reader sees: every package of the wheel is a folder under attnserve/
    (no package-dir mapping, no editable finder), and the code imports with the finder gone."""
    for package, folder in {
        "service": "service",
        "model": "model",
        "export": "export",
        "client": "client",
        "bench": "bench",
        "v1": "protos/attnserve/v1",
        "oip": "protos/attnserve/oip",
    }.items():
        assert (REPO_ROOT / "attnserve" / package).resolve() == REPO_ROOT / folder
    assert "package-dir" not in (REPO_ROOT / "pyproject.toml").read_text()
    code = (
        "import sys\n"
        "sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        "import attnserve.service.core.engine, attnserve.client.oip, attnserve.v1.wire\n"
        "print(attnserve.service.core.engine.__file__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(REPO_ROOT / "attnserve" / "service" / "core" / "engine.py")
