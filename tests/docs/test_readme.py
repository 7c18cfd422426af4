"""The README's tour runs as written against a server of the default model (what `make
serve` serves), and every relative link of the README and docs/ points at a file."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, ServerThread

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def tour_blocks() -> list[tuple[str, str]]:
    readme = (REPO_ROOT / "README.md").read_text()
    tour = readme.split("## A one-minute tour", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(sh|python)\n(.*?)```", tour, flags=re.S)


@pytest.fixture(scope="module")
def served(default_export):
    server = ServerThread(default_export[0])
    yield server
    server.stop()


def test_the_tour_has_its_blocks():
    kinds = [kind for kind, _ in tour_blocks()]
    assert kinds.count("sh") >= 3 and kinds.count("python") >= 2


@pytest.mark.parametrize("index", range(len(tour_blocks())))
def test_each_tour_block_runs_as_written(served, index):
    kind, code = tour_blocks()[index]
    code = code.replace("localhost:50051", served.address)
    code = code.replace("localhost:8080", served.http_url.removeprefix("http://"))
    command = ["bash", "-euo", "pipefail", "-c", code] if kind == "sh" else [sys.executable]
    result = subprocess.run(
        command,
        input=None if kind == "sh" else code,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip(), "every block prints its answer"
    if code.lstrip().startswith("curl"):
        answer = json.loads(result.stdout)
        assert "error" not in answer and (answer.get("data") or answer.get("outputs"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_point_at_files(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if not target.startswith(("http://", "https://")):
            assert (page.parent / target).exists(), f"{page.name}: {target}"
