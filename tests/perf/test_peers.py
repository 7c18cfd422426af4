"""`python -m perf peers`: KServe's model server, MLServer and PyTriton on the same
graphs and session settings, measured by tritonclient. The peers run for real, each in its
own virtual environment (made once, at the repository's root, as the benchmark makes them)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from attnserve.service.ort.sessions import session_options, session_settings
from perf import kserve_peer
from perf.full_maps import F16_KEPT, F16_PACKED, F32, PACKED_MAPS
from perf.peer_env import PEERS, Peer, peer_venv
from perf.peers import run_peers, table
from tests.conftest import REPO_ROOT, SMALL_CONFIG


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


@pytest.mark.parametrize("kind", PEERS, ids=lambda kind: kind.name)
def test_each_peer_serves_the_same_numbers_as_attnserve(kind, peer_python, small_model_dir):
    runtime = OrtRuntime(small_model_dir, RuntimeOptions(provider="cpu"))
    python = peer_venv(REPO_ROOT / kind.venv, print, kind.pins)
    peer = Peer(kind, python, small_model_dir, runtime, driver=peer_python)
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
        REPO_ROOT,
        duration=0.5,
        blocks=1,
        rounds=1,
        log=lambda _: None,
        big_map=False,
    )
    longest = SMALL_CONFIG.max_seq_len  # under 512: the rows stop at the model's limit
    assert [(r["seq_len"], r["attention"]) for r in result["latency"]] == [
        (8, "none"),
        (32, "none"),
        (128, "none"),
        (longest, "none"),
        (longest, F32),
        (longest, F16_PACKED),
        (longest, F16_KEPT),
    ]
    assert result["saturation"]["lengths"] == [8, longest]
    names = {"attnserve", *(kind.name for kind in PEERS)}
    for row in result["latency"]:
        servers = row["servers"]
        # the peers have no causal-packed answer: that row is attnserve against its floor
        assert set(servers) == (names if row["attention"] not in PACKED_MAPS else {"attnserve"})
        for times in servers.values():
            assert 0 < times["p50_ms"] <= times["p99_ms"]
        if row["attention"] not in PACKED_MAPS:
            best = min(servers[n]["p50_ms"] for n in names - {"attnserve"})
            assert row["p50_ratio"] == pytest.approx(
                servers["attnserve"]["p50_ms"] / best, rel=1e-2
            )
        # every row's floor: ORT here plus the echo of attnserve's answer's bytes
        floor = row["floor"]
        assert floor["in_turn"] == (row["attention"] == "none")
        assert floor["bytes"] > 0 and floor["runtime"]["p50_ms"] > 0
        assert floor["p50_ms"] == pytest.approx(
            floor["runtime"]["p50_ms"] + floor["echo"]["p50_ms"]
        )
        if "best_peer" in row:
            assert row["floor_vs_best_peer"] == pytest.approx(
                floor["p50_ms"] / servers[row["best_peer"]]["p50_ms"], rel=1e-2
            )
    sizes = {(r["seq_len"], r["attention"]): r["floor"]["bytes"] for r in result["latency"]}
    # The embeddings' answer grows with the length; every map's outweighs them all.
    plain = [sizes[t, "none"] for t in (8, 32, 128, longest)]
    assert plain == sorted(plain) and len(set(plain)) == 4
    assert min(sizes[longest, a] for a in (F32, *PACKED_MAPS)) > max(plain)
    packed = {a: sizes[longest, a] for a in PACKED_MAPS}
    # The same answer, decoded two ways: equal but for its three int64 timings, varints of
    # 0 to 11 bytes with their tags as the times come out.
    assert abs(packed[F16_KEPT] - packed[F16_PACKED]) <= 3 * 11
    engines = result["saturation"]["engines"]
    assert set(engines) == names | {"ORT in process, one at a time", "ORT in process, batcher"}
    assert all(e["tokens_per_s"] > 0 and e["errors"] == 0 for e in engines.values())
    assert result["saturation"]["best_peer"] == max(
        (kind.name for kind in PEERS), key=lambda n: engines[n]["tokens_per_s"]
    )
    open_loop = result["open_loop"]
    assert open_loop["peer"] == result["saturation"]["best_peer"]
    assert open_loop["attnserve"]["errors"] == 0 and open_loop["theirs"]["errors"] == 0
    saved = json.loads((tmp_path / "peers.json").read_text())
    assert saved == json.loads(json.dumps(result))
    assert (tmp_path / "peers.md").read_text() == table(result) + "\n"
