"""The one command that regenerates docs/BENCHMARKS.md, run in its quick mode."""

import json
import subprocess
import sys

import pytest

from perf.render import END_OF_GENERATED, SECTIONS
from tests.conftest import REPO_ROOT


def report(*args: str) -> subprocess.CompletedProcess:
    """`python -m perf report ...` from the repository's root, as `make benchmarks`."""
    command = [sys.executable, "-m", "perf", "report", *args]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    """One quick run of every benchmark and the page rendered from it."""
    tmp = tmp_path_factory.mktemp("report")
    out, doc = tmp / "results", tmp / "docs" / "BENCHMARKS.md"
    result = report("--out", str(out), "--doc", str(doc), "--quick")
    assert result.returncode == 0, result.stderr
    return out, doc


def test_report_regenerates_the_benchmarks_page(quick_report):
    out, doc = quick_report
    text = doc.read_text()
    assert len(text.splitlines()) < 20 * len(SECTIONS)  # a page a user reads, not a log
    for name, heading, _, command in SECTIONS:
        # too heavy for a quick run: images built, 0.1-9B models imported, SAEs added,
        # TransformerLens' patching grids, onnxruntime-genai's environment and a 1.1B model,
        # a 1.2B model at 8k tokens, two builds' servers of SmolLM2-135M's shape
        if name in ("containers", "families_second_round", "readouts", "features",
                    "features-llama-8b", "interventions", "generate", "together",
                    "long"):  # fmt: skip
            assert f"## {heading}" not in text
            continue
        assert f"## {heading}" in text and command in text
        assert (out / f"{name}.json").exists()
    for name in ("endpoints", "peers", "oip", "perf_analyzer", "attention"):
        assert (out / f"{name}.md").read_text().strip() in text  # each run's own table
    endpoints = json.loads((out / "endpoints.json").read_text())["rows"]
    assert [r["seq_len"] for r in endpoints] == [8, 32, 128, 512]
    for row in endpoints:
        assert all(0 < row[p]["p50_ms"] <= row[p]["p99_ms"] for p in row if p != "seq_len")
    batching = json.loads((out / "batching.json").read_text())
    on, off = (batching["variants"][k]["achieved_rate"] for k in ("batching on", "batching off"))
    assert f"Batching on / off: {on / off:.2f}x" in text
    saturation = json.loads((out / "peers.json").read_text())["saturation"]
    assert all(e["errors"] == 0 for e in saturation["engines"].values())
    assert (doc.parent / "latency.png").read_bytes()[:4] == b"\x89PNG"
    assert "](latency.png)" in text and text.rstrip().endswith(END_OF_GENERATED)


def test_rendering_keeps_the_hand_written_part(quick_report, tmp_path):
    """Rendering again from saved results rewrites the generated part only."""
    out, generated = quick_report
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(generated.read_text() + "\n## What it means\n\nWritten by a person.\n")
    result = report("--out", str(out), "--doc", str(doc), "--render-only")
    assert result.returncode == 0, result.stderr
    text = doc.read_text()
    assert text.count("# Benchmarks\n") == 1
    assert text.endswith("## What it means\n\nWritten by a person.\n")
