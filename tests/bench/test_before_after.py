import json
import os
import subprocess
import sys

from attnserve.bench.before_after import sources_of
from attnserve.bench.render import before_after_section
from tests.conftest import run_cli


def test_a_commits_sources_import_as_attnserve_from_the_scratch_folder():
    with sources_of("HEAD") as src:
        where = subprocess.run(
            [sys.executable, "-c", "import attnserve.service.servicer as m; print(m.__file__)"],
            cwd=src,  # as the benchmark runs it: this checkout's folder would come first
            env={**os.environ, "PYTHONPATH": str(src)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert where == str(src / "attnserve" / "service" / "servicer.py")


def test_quick_before_after_serves_both_and_splits_each_call(tmp_path):
    # HEAD: any clone has it. make benchmarks compares with the commit before issue 12.
    result = run_cli(
        "bench", "before-after", "--out", str(tmp_path), "--ref", "HEAD", "--quick",
        "--max-seq-len", "16",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "before_after.json").read_text())
    assert [r["seq_len"] for r in report["rows"]] == [8, 16]
    for row in report["rows"]:
        assert row["bare_grpc_p50_ms"] > 0
        for version in (row["before"], row["after"]):  # each server timed its own calls
            assert 0 < version["inside_p50_ms"] < version["encode_p50_ms"]
            outside = version["encode_p50_ms"] - version["inside_p50_ms"]
            assert abs(version["outside_p50_ms"] - outside) < 1e-3
            assert abs(version["outside_to_bare"] - outside / row["bare_grpc_p50_ms"]) < 0.01
    assert (tmp_path / "before_after.png").read_bytes()[:4] == b"\x89PNG"
    section = before_after_section(tmp_path)
    assert (tmp_path / "before_after.md").read_text().strip() in section
    assert "](before_after.png)" in section


def test_an_unknown_commit_is_refused_by_name(tmp_path):
    result = run_cli("bench", "before-after", "--out", str(tmp_path), "--ref", "no-such-ref")
    assert result.returncode == 1
    assert "--ref no-such-ref" in result.stderr and "Traceback" not in result.stderr
