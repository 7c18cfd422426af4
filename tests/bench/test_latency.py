import csv
import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnserve.bench.latency import model_flops
from tests.conftest import SMALL_CONFIG, run_cli

ENGINES = [
    "torch-eager",
    "ort-cpu",
    "ort-cpu-emb",
    "torch-eager-emb",
    "grpc-emb",
    "grpc-attn-f16-packed",
    "ort-cuda",
]


@pytest.mark.parametrize(("batch", "seq_len"), [(1, 8), (3, 33)])
def test_flop_formula_matches_pytorch_flop_counter(small_model, batch, seq_len):
    ids = torch.zeros(batch, seq_len, dtype=torch.int64)
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        small_model(ids)
    assert model_flops(SMALL_CONFIG, batch, seq_len) == counter.get_total_flops()


def test_quick_sweep_writes_json_csv_table_and_plot(tmp_path):
    result = run_cli(
        "bench",
        "latency",
        "--out",
        str(tmp_path),
        "--max-seq-len",
        "16",
        "--batch-sizes",
        "1,2",
        "--engines",
        ",".join(ENGINES),
        "--quick",
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads((tmp_path / "latency.json").read_text())
    env = json.loads((tmp_path / "environment.json").read_text())
    available = [e for e in ENGINES if e not in env["unavailable_engines"]]
    assert "ort-cuda" in available or "CUDA" in env["unavailable_engines"]["ort-cuda"]
    assert {(r["engine"], r["batch"], r["seq_len"]) for r in rows} == {
        (e, b, t) for e in available for b in (1, 2) for t in (8, 16)
    }
    for r in rows:
        assert 0 < r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"]
        assert r["samples"] >= 3 and r["skipped"] is None
        assert r["gflops"] > 0 and r["pct_of_peak"] > 0
    assert env["matmul_peak_gflops"] > 0
    with (tmp_path / "latency.csv").open() as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert (tmp_path / "latency.png").read_bytes()[:4] == b"\x89PNG"
    table = (tmp_path / "latency.md").read_text()
    assert "### batch 2" in table and "| 16 |" in table and "x) |" in table
    assert "latency sweep" in result.stderr  # the progress bar
