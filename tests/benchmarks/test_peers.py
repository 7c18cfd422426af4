"""`python -m benchmarks peers`: KServe's model server on the same graph and session
settings, measured by its own client. The peer runs for real, in its own virtual environment
(made once, in .venv-peers at the repository's root, as the benchmark makes it)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnserve.service.ort.runtime import (
    OrtRuntime,
    RuntimeOptions,
    session_options,
    session_settings,
)
from benchmarks import kserve_peer
from benchmarks.peer_env import KServePeer
from benchmarks.peers import run_peers, table
from tests.conftest import SMALL_CONFIG


@pytest.mark.parametrize("options", [RuntimeOptions(), RuntimeOptions(intra_op_threads=1)])
def test_the_peer_opens_its_sessions_with_the_servers_settings(options):
    ours = session_options(options)
    theirs = kserve_peer.session_options(json.loads(json.dumps(session_settings(options))))
    for attribute in (
        "graph_optimization_level",
        "intra_op_num_threads",
        "inter_op_num_threads",
        "enable_mem_pattern",
    ):
        assert getattr(theirs, attribute) == getattr(ours, attribute), attribute
    for key in session_settings(options)["config_entries"]:
        assert theirs.get_session_config_entry(key) == ours.get_session_config_entry(key), key


def test_kserve_serves_the_same_numbers_as_attnserve(peer_python, small_model_dir):
    runtime = OrtRuntime(small_model_dir, RuntimeOptions(provider="cpu"))
    peer = KServePeer(peer_python, small_model_dir, runtime)
    try:
        ids = list(range(1, 40))
        theirs = np.array(peer.ask("embed", ids=ids)["embeddings"], dtype=np.float32)
    finally:
        peer.close()
    ours = runtime.embed(np.array([ids], dtype=np.int64))[0]
    np.testing.assert_allclose(theirs, ours, atol=1e-6, rtol=0)


def test_a_short_run_measures_every_row_and_writes_its_table(
    peer_python, small_model_dir, tmp_path
):
    result = run_peers(
        tmp_path,
        small_model_dir,
        peer_python.parents[1],
        duration=0.5,
        blocks=1,
        rounds=1,
        log=lambda _: None,
    )
    longest = SMALL_CONFIG.max_seq_len  # under 512: the rows stop at the model's limit
    assert [(r["seq_len"], r["attention"]) for r in result["latency"]] == [
        (8, "none"),
        (32, "none"),
        (128, "none"),
        (longest, "none"),
        (longest, "all, float32"),
    ]
    assert result["saturation"]["lengths"] == [8, longest]
    for row in result["latency"]:
        for server in ("attnserve", "kserve"):
            assert 0 < row[server]["p50_ms"] <= row[server]["p99_ms"]
        assert row["p50_ratio"] == pytest.approx(
            row["attnserve"]["p50_ms"] / row["kserve"]["p50_ms"], rel=1e-2
        )
    engines = result["saturation"]["engines"]
    assert set(engines) == {
        "attnserve",
        "attnserve, previous policy",
        "attnserve, no batching",
        "KServe",
        "ORT in process, one at a time",
        "ORT in process, batcher",
    }
    assert all(e["tokens_per_s"] > 0 and e["errors"] == 0 for e in engines.values())
    assert result["open_loop"]["attnserve"]["errors"] == 0
    assert result["open_loop"]["kserve"]["errors"] == 0
    saved = json.loads((tmp_path / "peers.json").read_text())
    assert saved == json.loads(json.dumps(result))
    assert (tmp_path / "peers.md").read_text() == table(result) + "\n"
