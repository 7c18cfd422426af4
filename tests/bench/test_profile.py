import json
import os

from tests.conftest import run_cli


def test_profile_counts_each_threads_cpu_and_draws_both_flame_graphs(small_model_dir, tmp_path):
    result = run_cli(
        "bench",
        "profile",
        "--out",
        str(tmp_path),
        "--model",
        str(small_model_dir),
        "--seconds",
        "1",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "profile.json").read_text())
    assert report["calls"] > 0 and report["call_ms"] > 0 and report["recorded_calls"] > 0
    server, client = report["cpu_ms_per_call"]["server"], report["cpu_ms_per_call"]["client"]
    # Named as py-spy names Python threads: the event loop, and the batcher's ORT worker.
    assert server["MainThread"] > 0 and server["backend_0"] > 0
    assert client["MainThread"] > 0
    # One call's work fits in what the machine's cores can give it: no thread counted twice.
    cores = os.cpu_count()
    assert sum(server.values()) + sum(client.values()) <= cores * report["call_ms"] * 1.05
    # Each graph holds the frame its process spends most of a call in (the server's Encode
    # handler itself runs too briefly to be sampled for sure in one second).
    for name, frame in (
        ("profile_server.svg", "OrtRuntime.embed"),
        ("profile_client.svg", "EncoderClient.encode"),
    ):
        svg = (tmp_path / name).read_text()
        assert "<svg" in svg and frame in svg
    assert "| server | MainThread |" in (tmp_path / "profile.md").read_text()
