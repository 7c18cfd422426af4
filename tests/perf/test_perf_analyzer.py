"""perf_analyzer (Triton's load generator, fetched from the registries) against the real
in-process server's V2 endpoint: it starts, its requests are answered, its report is read."""

from __future__ import annotations

from pathlib import Path

from attnserve.oip import grpc_service_pb2 as oip
from attnserve.oip import grpc_service_pb2_grpc as oip_grpc
from perf.perf_analyzer import TOOLS, install, measure
from tests.conftest import SMALL_CONFIG


def _counts(client) -> tuple[int, int]:
    """The V2 model's (successful, failed) inferences so far."""
    stub = oip_grpc.GRPCInferenceServiceStub(client.channel)
    request = oip.ModelStatisticsRequest(name=SMALL_CONFIG.name)
    stats = stub.ModelStatistics(request).model_stats[0].inference_stats
    return stats.success.count, stats.fail.count


def test_perf_analyzer_loads_the_v2_endpoint(server, client, tmp_path):
    binary, env = install(Path.cwd() / TOOLS)
    success, fail = _counts(client)
    rows = measure(binary, env, server.address, SMALL_CONFIG.name, 8, (1, 2), tmp_path, 500)
    assert [r["concurrency"] for r in rows] == [1, 2]
    for row in rows:
        assert row["infer_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["server_compute_ms"] > 0
    # The server answered at least what perf_analyzer counted in its windows, and refused none.
    success_after, fail_after = _counts(client)
    assert success_after - success >= sum(r["infer_per_s"] * 0.5 for r in rows)
    assert fail_after == fail


def test_perf_analyzer_runs_through_system_shared_memory(server, client, tmp_path):
    """`--shared-memory system`: perf_analyzer places every input and output in POSIX
    shared memory regions it registers; the server reads and writes them, refusing none."""
    binary, env = install(Path.cwd() / TOOLS)
    success, fail = _counts(client)
    rows = measure(binary, env, server.address, SMALL_CONFIG.name, 8, (1,), tmp_path, 500, "system")
    assert [(r["concurrency"], r["shared_memory"]) for r in rows] == [(1, "system")]
    assert rows[0]["infer_per_s"] > 0
    success_after, fail_after = _counts(client)
    assert success_after - success >= rows[0]["infer_per_s"] * 0.5
    assert fail_after == fail
