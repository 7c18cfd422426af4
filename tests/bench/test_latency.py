import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bench.latency import BASELINES, model_flops
from tests.conftest import SMALL_CONFIG, run_module


@pytest.mark.parametrize(("batch", "seq_len"), [(1, 8), (3, 33)])
def test_flop_formula_matches_pytorch_flop_counter(small_model, batch, seq_len):
    ids = torch.zeros(batch, seq_len, dtype=torch.int64)
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        small_model(ids)
    assert model_flops(SMALL_CONFIG, batch, seq_len) == counter.get_total_flops()


def test_quick_sweep_writes_json_and_table(tmp_path):
    result = run_module(
        "bench", "latency", "--out", str(tmp_path), "--max-seq-len", "16", "--quick"
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "latency.json").read_text())
    assert report["matmul_peak_gflops"] > 0
    rows = report["rows"]
    assert {(r["engine"], r["seq_len"]) for r in rows} == {
        (engine, t) for engine in BASELINES for t in (8, 16)
    }
    for r in rows:
        assert 0 < r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"]
        assert r["batch"] == 1 and r["repeats"] > 0
    table = (tmp_path / "latency.md").read_text()
    assert table.count("\n") == 4  # header, rule, one line per length
    assert "| 1 | 16 |" in table and "x) |" in table  # ratios against the baseline
    assert "seq_len    16" in result.stderr  # progress while it runs
