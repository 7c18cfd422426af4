"""The committed generated code matches the .proto, and the .proto passes buf lint."""

import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

PROTOS = REPO_ROOT / "protos"
BUF = REPO_ROOT / ".tools" / "node_modules" / ".bin" / "buf"


def test_generated_code_matches_the_proto(tmp_path):
    result = subprocess.run(
        [sys.executable, str(PROTOS / "generate.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*_pb2*.py*"))
    assert fresh, "protoc generated nothing"
    for relative in fresh:
        committed = PROTOS / relative
        assert committed.exists(), f"{relative} is not committed: run `make proto`"
        assert committed.read_text() == (tmp_path / relative).read_text(), (
            f"{relative} is stale: run `make proto` and commit the result"
        )


def buf_binary() -> str:
    found = BUF if BUF.exists() else shutil.which("buf")
    if found is None:  # the lint is part of the contract: a missing tool is a failure
        pytest.fail("buf is not installed: `make lint` (run by `make test`) puts it in .tools/")
    return str(found)


def test_buf_lint_standard_rules():
    result = subprocess.run([buf_binary(), "lint"], cwd=PROTOS, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
