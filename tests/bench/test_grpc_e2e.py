import json

from attnserve.bench.pause import PAUSES_MS
from tests.conftest import run_cli


def test_quick_grpc_benchmark_writes_its_tables(small_model_dir, tmp_path):
    result = run_cli(
        "bench",
        "grpc",
        "--out",
        str(tmp_path),
        "--model",
        str(small_model_dir),
        "--max-seq-len",
        "16",
        "--quick",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "grpc.json").read_text())
    assert report["empty_rpc_p50_ms"] > 0
    rows = report["embeddings_overhead"]
    assert [r["seq_len"] for r in rows] == [8, 16]
    for r in rows:
        assert r["grpc_p50_ms"] > 0 and r["runtime_p50_ms"] > 0
        assert abs(r["overhead_p50_ms"] - (r["grpc_p50_ms"] - r["runtime_p50_ms"])) < 1e-3
        assert r["bare_grpc_p50_ms"] > 0
        assert 0 < r["server_inference_p50_ms"] <= r["server_total_p50_ms"]
        assert abs(r["overhead_to_bare"] - r["overhead_p50_ms"] / r["bare_grpc_p50_ms"]) < 0.01
        for shape in ("minimal", "inline", "sync"):  # the Python servers that only run the model
            only_model = r[f"{shape}_server_p50_ms"] - r["runtime_p50_ms"]
            assert abs(r[f"{shape}_overhead_to_bare"] - only_model / r["bare_grpc_p50_ms"]) < 0.01
        assert r["best_python_overhead_to_bare"] == min(
            r[f"{shape}_overhead_to_bare"] for shape in ("minimal", "inline", "sync")
        )
        # Each leg is a part of its own calls, so its median is within theirs.
        for name, round_trip in (("bare", "bare_grpc"), ("minimal", "minimal_server")):
            for leg in ("to_handler", "back"):
                assert 0 < r[f"{name}_{leg}_p50_ms"] <= r[f"{round_trip}_p50_ms"]
        legs = r["minimal_to_handler_p50_ms"] + r["minimal_back_p50_ms"]
        assert abs(r["minimal_legs_to_bare"] - legs / r["bare_grpc_p50_ms"]) < 0.01
    pauses = report["runtime_after_pause"]
    assert [r["pause_ms"] for r in pauses] == list(PAUSES_MS)
    for r in pauses:  # asleep (the server's runtime), and spinning with one ORT thread
        for p50, ratio in (
            ("runtime_p50_ms", "to_back_to_back"),
            ("spinning_one_thread_p50_ms", "spinning_to_back_to_back"),
        ):
            assert r[p50] > 0
            assert abs(r[ratio] - r[p50] / pauses[0][p50]) < 0.01
    stream = report["stream_vs_unary"]
    assert stream["requests"] == 200 and stream["stream_ms"] > 0 and stream["unary_ms"] > 0
    assert (tmp_path / "grpc_breakdown.png").read_bytes()[:4] == b"\x89PNG"
