"""The load generator's arithmetic, against a real server process."""

import asyncio
import json
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from attnserve.bench.load import LoadGenerator, RequestKind, summarize
from tests.conftest import run_cli


def _stopped(pid: int) -> bool:
    """The kernel's word that the process is stopped (state T in /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] in "Tt"


def test_a_stalled_server_cannot_hide_its_queueing(cli_server):
    """Open loop, at most 2 requests in flight, the server frozen (SIGSTOP) for a while.

    Requests scheduled during the freeze are sent late (held back by the cap);
    their latency counts from the intended send time, so it includes the
    freeze, while their service time (what a closed-loop tool reports) does not.
    The freeze is marked only once the kernel says the process is stopped, and
    thawed after the mark, so every comparison below is exact: no tolerances.
    """
    generator = LoadGenerator(cli_server.address, [RequestKind(16)], seed=1)
    process = cli_server.process
    marks = {}

    def freeze():
        process.send_signal(signal.SIGSTOP)
        while not _stopped(process.pid):
            time.sleep(0.001)
        marks["stop"] = time.perf_counter()
        time.sleep(0.5)  # how long the freeze lasts; nothing is asserted about it
        marks["cont"] = time.perf_counter()
        process.send_signal(signal.SIGCONT)

    timer = threading.Timer(0.6, freeze)
    timer.start()
    records, elapsed = asyncio.run(generator.open_loop(40, 2.0, max_in_flight=2, progress=False))
    timer.join()
    stop, cont = (marks[k] - generator.started_at for k in ("stop", "cont"))
    assert all(r.status == "OK" for r in records)
    for r in records:  # the definitions the report rests on
        assert r.latency == pytest.approx(r.done - r.intended)
        assert r.service_time == pytest.approx(r.done - r.sent)
        assert r.sent >= r.intended
    frozen = [r for r in records if stop < r.intended < cont]
    assert len(frozen) >= 8
    for r in frozen:  # a stopped server answers nothing before it is thawed
        assert r.done > cont
        assert r.latency > cont - r.intended
    # Two may go out at once; every other one waits for a slot, which frees only after the thaw.
    held_back = [r for r in frozen if r.sent > cont]
    assert len(held_back) >= len(frozen) - 2
    assert all(r.latency - r.service_time >= cont - r.intended for r in held_back)
    summary = summarize(records, elapsed, 40, 2.0)
    worst_hidden = max(r.service_time for r in held_back)
    assert summary["latency_ms"]["max"] / 1e3 > worst_hidden  # the freeze shows in latency


def test_rate_and_percentile_accounting(cli_server):
    generator = LoadGenerator(cli_server.address, [RequestKind(8), RequestKind(64)], seed=2)
    schedule = LoadGenerator(cli_server.address, [RequestKind(8)], seed=2).schedule(30, 2.0)
    records, elapsed = asyncio.run(generator.open_loop(30, 2.0, progress=False))
    summary = summarize(records, elapsed, 30, 2.0)
    # The run sent exactly what its seeded Poisson schedule held, no more, no less.
    assert summary["requests"] == len(schedule) == len(records)
    np.testing.assert_allclose(sorted(r.intended for r in records), schedule)
    assert summary["ok"] + sum(summary["errors"].values()) == summary["requests"]
    assert summary["scheduled_rate"] == round(len(schedule) / 2.0, 3)
    assert summary["achieved_rate"] == round(summary["ok"] / elapsed, 3)
    assert elapsed >= schedule[-1]
    latencies = np.array([r.latency for r in records]) * 1e3
    for name, q in (("p50", 50), ("p99", 99), ("p99.9", 99.9)):
        assert summary["latency_ms"][name] == round(float(np.percentile(latencies, q)), 3)
    assert (
        summary["latency_ms"]["p50"] <= summary["latency_ms"]["p99"] <= summary["latency_ms"]["max"]
    )
    server_total = [r.server_total_ms for r in records]
    assert summary["server_ms"]["total"]["p50"] == round(float(np.percentile(server_total, 50)), 3)
    assert all(r.server_total_ms <= r.service_time * 1e3 + 1e-6 for r in records)


def test_closed_loop_never_exceeds_its_concurrency(cli_server):
    generator = LoadGenerator(cli_server.address, [RequestKind(32)], seed=3)
    records, _ = asyncio.run(generator.closed_loop(4, 1.0, progress=False))
    assert len(records) > 8
    events = sorted([(r.sent, 1) for r in records] + [(r.done, -1) for r in records])
    in_flight = np.cumsum([delta for _, delta in events])
    assert in_flight.max() <= 4
    assert all(r.intended == r.sent for r in records)  # closed loop: no schedule to miss


def test_errors_are_counted_by_status(cli_server):
    mix = [RequestKind(16), RequestKind(400)]  # 400 > the model's max_seq_len of 300
    generator = LoadGenerator(cli_server.address, mix, seed=4)
    records, elapsed = asyncio.run(generator.open_loop(40, 1.0, progress=False))
    summary = summarize(records, elapsed, 40, 1.0)
    too_long = sum(r.kind == 1 for r in records)
    assert too_long > 0
    assert summary["errors"] == {"INVALID_ARGUMENT": too_long}
    assert summary["ok"] == len(records) - too_long


def test_cli_step_search_writes_a_report(cli_server, tmp_path):
    out = tmp_path / "load.json"
    result = run_cli(
        "bench",
        "load",
        "--target",
        cli_server.address,
        "--rates",
        "10,20",
        "--duration",
        "1",
        "--lengths",
        "8",
        "--p99-target-ms",
        "1000",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert "highest rate with p99 <= 1000 ms: 20 req/s" in result.stdout
    report = json.loads(out.read_text())
    steps = report["search"]["steps"]
    assert [s["offered_rate"] for s in steps] == [10.0, 20.0]
    assert all(s["within_target"] for s in steps)


def test_cli_waits_for_serving_then_spreads_over_dns_addresses(cli_server, tmp_path):
    # "localhost" resolves to one address here; the point is that the round_robin channel
    # and the readiness wait work through the CLI end to end.
    port = cli_server.address.rsplit(":", 1)[1]
    out = tmp_path / "load.json"
    result = run_cli(
        "bench", "load", "--target", f"dns:///localhost:{port}", "--round-robin",
        "--wait-ready", "30", "--mode", "closed", "--concurrency", "2", "--duration", "0.5",
        "--lengths", "8", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())["summary"]
    assert summary["ok"] == summary["requests"] > 0


def test_cli_wait_ready_gives_up_with_a_clear_error(tmp_path):
    result = run_cli(
        "bench", "load", "--target", "127.0.0.1:9", "--wait-ready", "1", "--duration", "0.5"
    )
    assert result.returncode == 1
    assert "127.0.0.1:9: server not SERVING after 1s" in result.stderr


def test_http_protocol_drives_openai_embeddings(cli_server):
    target = f"http://127.0.0.1:{cli_server.http_port}"
    generator = LoadGenerator(target, [RequestKind(8), RequestKind(400)], seed=5, protocol="http")
    records, elapsed = asyncio.run(generator.closed_loop(2, 0.5, progress=False))
    summary = summarize(records, elapsed)
    too_long = sum(r.kind == 1 for r in records)  # 400 > the model's max_seq_len of 300
    assert summary["ok"] == len(records) - too_long > 0
    assert summary["errors"] == ({"HTTP_400": too_long} if too_long else {})
    assert summary["server_ms"]["total"] == {}  # /v1/embeddings carries no server timings


def test_http_protocol_refuses_attention_mixes():
    with pytest.raises(ValueError, match="attention must be 'none'"):
        LoadGenerator("http://127.0.0.1:1", [RequestKind(8, "float32-full")], protocol="http")
