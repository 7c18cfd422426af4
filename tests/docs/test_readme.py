"""The README's tour and the Python client's, generation's, attribution graphs' and the Open
Inference Protocol's examples in docs/api.md run as written against a server of the default
model (what `make serve` serves, its SAE and transcoders included) and show their effect,
and every relative link of the README and docs/ points at a file."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, ServerThread

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def blocks(page: str, section: str) -> list[tuple[str, str]]:
    """The fenced sh and python blocks of one section of a page."""
    text = (REPO_ROOT / page).read_text()
    part = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(sh|python)\n(.*?)```", part, flags=re.S)


def tour_blocks() -> list[tuple[str, str]]:
    return (
        blocks("README.md", "A one-minute tour")
        + blocks("docs/api.md", "The Python client and the command line")
        + blocks("docs/api.md", "Generation")
        + blocks("docs/api.md", "Attribution graphs")
        + blocks("docs/api.md", "The Open Inference Protocol")
    )


@pytest.fixture(scope="module")
def served(default_export):
    server = ServerThread(default_export[0])
    yield server
    server.stop()


def test_the_tour_has_its_blocks():
    kinds = [kind for kind, _ in blocks("README.md", "A one-minute tour")]
    assert kinds.count("sh") >= 3 and kinds.count("python") >= 2
    v2 = [code for _, code in blocks("docs/api.md", "The Open Inference Protocol")]
    assert any("tritonclient" in c for c in v2) and any("buf curl" in c for c in v2)


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
    # an example shows what it claims: the steered text differs from the plain one (the
    # blocks assert it), and no answer comes with a warning (a patching pair that moves)
    assert "warning:" not in result.stdout.lower(), result.stdout
    if code.lstrip().startswith("curl"):
        answer = json.loads(result.stdout)
        assert "error" not in answer and (answer.get("data") or answer.get("outputs"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_point_at_files(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if not target.startswith(("http://", "https://")):
            assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_every_metric_is_documented():
    """docs/deployment.md's metrics table names every series the server exports, and no
    other (a counter's series ends in _total)."""
    from attnserve.service.core.metrics import Metrics

    page = (REPO_ROOT / "docs" / "deployment.md").read_text()
    exported = {metric.name for metric in Metrics().registry.collect()}
    documented = {name.removesuffix("_total") for name in re.findall(r"`(attnserve_\w+)`", page)}
    assert exported and documented == exported


def test_the_benchmarks_page_answers_each_question_once():
    """docs/BENCHMARKS.md is a product page, not a lab log: each heading once (earlier runs
    live in research/benchmark-runs), at most 400 lines."""
    lines = (REPO_ROOT / "docs" / "BENCHMARKS.md").read_text().splitlines()
    headings = [line for line in lines if line.startswith("#")]
    assert len(headings) == len(set(headings))
    assert len(lines) <= 400
