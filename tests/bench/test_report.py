"""The one command that regenerates docs/BENCHMARKS.md, run in its quick mode."""

import json
import re

from tests.conftest import run_cli


def test_report_regenerates_the_benchmarks_page(tmp_path):
    out, doc = tmp_path / "results", tmp_path / "docs" / "BENCHMARKS.md"
    result = run_cli("bench", "report", "--out", str(out), "--doc", str(doc), "--quick")
    assert result.returncode == 0, result.stderr
    text = doc.read_text()
    for section in (
        "## Targets",
        "## Latency across sequence lengths",
        "### Batch 8",
        "## End to end through gRPC",
        "## Dynamic batching",
        "## What it means",
    ):
        assert section in text
    # Six targets, each with a verdict; every verdict is a real outcome of this run.
    verdicts = re.findall(r"^\| .+ \| .+ \| (yes|\*\*no\*\*|-) \|$", text, flags=re.M)
    assert len(verdicts) == 6
    batching = json.loads((out / "batching.json").read_text())
    batching_met = batching["speedup"] >= 1.8
    assert re.search(r"batching >= 1\.8x .* \| " + ("yes" if batching_met else r"\*\*no\*\*"), text)
    assert (doc.parent / "latency.png").read_bytes()[:4] == b"\x89PNG"
    assert "](latency.png)" in text
    assert "n/a" not in text.split("## What it means")[1]  # every quoted number was measured
