"""The one command that regenerates docs/BENCHMARKS.md, run in its quick mode."""

import json
import re

import pytest

from tests.conftest import run_cli


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    """One quick run of every benchmark and the page rendered from it."""
    tmp = tmp_path_factory.mktemp("report")
    out, doc = tmp / "results", tmp / "docs" / "BENCHMARKS.md"
    result = run_cli("bench", "report", "--out", str(out), "--doc", str(doc), "--quick")
    assert result.returncode == 0, result.stderr
    return out, doc


def test_report_regenerates_the_benchmarks_page(quick_report):
    out, doc = quick_report
    text = doc.read_text()
    for section in (
        "## Targets",
        "## Latency across sequence lengths",
        "### Batch 8",
        "## End to end through gRPC",
        "### Inside the two processes",
        "## Dynamic batching",
        "## Against the peers: KServe's model server",
        "## Attention options and the memory budget",
        "## Comparisons computed from this run",
    ):
        assert section in text
    # Every target has a verdict, and every verdict is a real outcome of this run.
    verdicts = re.findall(r"^\| .+ \| .+ \| (yes|\*\*no\*\*|-) \|$", text, flags=re.M)
    assert len(verdicts) >= 8  # the quick run's lengths stop short of the matmul-floor target
    batching = json.loads((out / "batching.json").read_text())
    stream = json.loads((out / "grpc.json").read_text())["stream_vs_unary"]
    saturation = json.loads((out / "peers.json").read_text())["saturation"]
    engines = saturation["engines"]
    assert all(e["errors"] == 0 for e in engines.values())
    vs_kserve = engines["attnserve"]["tokens_per_s"] / engines["KServe"]["tokens_per_s"]
    assert abs(saturation["vs_kserve"] - vs_kserve) < 1e-3
    attention = json.loads((out / "attention.json").read_text())
    modes = {r["mode"]: r for r in attention["modes"]}
    # Every layer and head at 64 tokens (default config: 4 x 8): f32 full vs f16 packed bytes.
    saved = (
        modes["all heads, f32 full"]["response_bytes"]
        - modes["all heads, f16 packed"]["response_bytes"]
    )
    assert abs(saved - 4 * 8 * (64 * 64 * 4 - 2080 * 2)) <= 12  # timings' varints vary
    assert modes["last row"]["response_bytes"] < modes["all heads, f16 packed"]["response_bytes"]
    burst = attention["burst"][-1]
    assert "(default)" in burst["variant"] and burst["requests"] == 4
    burst_met = (
        burst["errors"] == 0
        and burst["peak_over_baseline_mib"] <= 1536
        and burst["after_over_baseline_mib"] <= 300
    )
    for target, met in (
        (r"burst of 4 x 64 tokens", burst_met),
        (r"batching >= 1\.8x", batching["speedup"] >= 1.8),
        (r"a stream of 200 short requests", stream["speedup"] >= 2),
        (r"saturated tokens/s >= 1\.2x KServe's", saturation["vs_kserve"] >= 1.2),
    ):
        assert re.search(target + r".* \| " + ("yes" if met else r"\*\*no\*\*") + r" \|", text)
    assert (doc.parent / "latency.png").read_bytes()[:4] == b"\x89PNG"
    assert "](latency.png)" in text
    assert (doc.parent / "grpc_breakdown.png").read_bytes()[:4] == b"\x89PNG"
    assert "](grpc_breakdown.png)" in text
    for flame in ("profile_server.svg", "profile_client.svg"):
        assert "<svg" in (doc.parent / flame).read_text() and f"]({flame})" in text
    comparisons = text.split("## Comparisons computed from this run")[1]
    assert "n/a" not in comparisons  # every quoted number was measured
    assert "`ort-cpu` / `ort-matmul-only`" in comparisons  # ORT's own floor ran too
    # Each comparison is this run's arithmetic: the batching ratio is req/s on / off.
    on, off = (batching["variants"][k]["achieved_rate"] for k in ("batching on", "batching off"))
    assert f"{on:.0f} / {off:.0f} req/s ({batching['speedup']:.2f}x)" in comparisons


def test_rendering_keeps_the_hand_written_part(quick_report, tmp_path):
    """Rendering again from saved results rewrites the generated part only."""
    out, generated = quick_report
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text(generated.read_text() + "\n## What it means\n\nWritten by a person.\n")
    result = run_cli("bench", "report", "--out", str(out), "--doc", str(doc), "--render-only")
    assert result.returncode == 0, result.stderr
    text = doc.read_text()
    assert text.count("## Comparisons computed from this run") == 1
    assert text.endswith("## What it means\n\nWritten by a person.\n")
