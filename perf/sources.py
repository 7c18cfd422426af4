"""An earlier commit's code, runnable beside this checkout's: for before-and-after runs."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def sources_of(ref: str) -> Iterator[Path]:
    """`ref`'s files in a scratch folder that imports as `attnserve` for Python run in it
    with it on PYTHONPATH: each package folder is linked where the package's name puts
    it, as pyproject.toml mapped them for an install (later commits carry those links)."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPOSITORY), "archive", "--format=tar", ref],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        why = getattr(exc, "stderr", b"").decode().strip() or str(exc)
        raise RuntimeError(f"--ref {ref}: not in this git checkout: {why}") from exc
    with tempfile.TemporaryDirectory(prefix="attnserve-before-") as tmp:
        src = Path(tmp)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(src, filter="data")
        pyproject = tomllib.loads((src / "pyproject.toml").read_text())
        for package, folder in pyproject["tool"]["setuptools"].get("package-dir", {}).items():
            link = src / package.replace(".", "/")
            if not link.exists():
                link.symlink_to(src / folder, target_is_directory=True)
        yield src


def environment(src: Path | None) -> dict[str, str] | None:
    """The environment that runs `src`'s code (None: this checkout's, as installed)."""
    return None if src is None else {**os.environ, "PYTHONPATH": str(src)}
