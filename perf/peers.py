"""attnserve beside the servers a user would pick instead: KServe's Python model server,
MLServer and PyTriton.

Each serves the same graphs with the same ORT session settings (ort/sessions.py session_settings)
on this machine, each measured through its usual client (attnserve's AsyncEncoderClient;
tritonclient for the peers), side by side in one run. Every client's process, and the
echo server's, keeps its freed heap (attnserve.client.keep_freed_heap; glibc's tunables
where attnserve does not run): large answers decode into warm pages, for all alike.

1. latency of one request at a time, T = 8, 32, 128, 512 (embeddings) and all attention
   weights in float32 at 512, every server in turn within each block; each row also
   against its floor (ONNX Runtime's own run of the same graph in this process plus a bare
   gRPC echo of attnserve's answer's bytes; for the embeddings, the run and the echo in
   turn), and attnserve's float16 causal-packed maps against theirs, unpacked by the client
   and kept packed;
2. saturated throughput, 64 requests in flight, lengths uniform in 8..512 on the same
   draws: attnserve, each peer, and ORT alone in this process, one request at a time and
   through the batcher;
3. an open loop (Poisson) at 70% of the best peer's saturated rate, same mix: p50 and p99;
4. (unless skipped) a full map of SmolLM2-135M's shape at 1024 tokens, float16
   causal-packed (unpacked by the client, kept packed, and a layer per message), against its
   floor.

The peers and tritonclient run in environments of their own (peer_env.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

from attnserve.bench.load import LoadGenerator, RequestKind, summarize
from attnserve.bench.results import save
from attnserve.client import AsyncEncoderClient, ClientOptions, keep_freed_heap
from attnserve.model.artifacts import ModelDirectory
from attnserve.service.core.batching import BatcherOptions
from attnserve.service.core.engine import Engine
from attnserve.service.core.metrics import Metrics
from attnserve.service.models import model_instances
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from attnserve.service.settings import Settings
from perf.echo import Echo, echo_server
from perf.full_maps import (
    ATTNSERVE,
    F16_KEPT,
    F32,
    MAP_OPTIONS,
    PACKED_MAPS,
    big_map_summary,
    big_map_targets,
    encode_ms,
    measure_big_map,
    runtime_ms,
    serve_attnserve,
)
from perf.peer_env import KSERVE, PEERS, Peer, PeerKind, ort_distribution, peer_venv

LATENCY_LENGTHS = (8, 32, 128, 512)  # and all attention weights at the longest
P50_TARGETS = {8: 0.9, 32: 0.9, 128: 1.0, 512: 1.0}  # p50 / the best peer's, at most
SHORTEST, LONGEST = 8, 512  # the mixed load: lengths uniform in 8..512
CONCURRENCY = 64
OPEN_LOOP_SHARE = 0.7  # of the best peer's saturated rate
SEED = 0


def _percentile_row(times: list[float]) -> dict:
    return {"p50_ms": round(float(np.median(times)), 3), "p99_ms": round(_p99(times), 3)}


def _p99(times: list[float]) -> float:
    return float(np.percentile(times, 99))


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _best_peer(servers: dict[str, dict], key: str = "p50_ms") -> str:
    return min((name for name in servers if name != ATTNSERVE), key=lambda n: servers[n][key])


def measure_latency(
    address: str,
    peers: Sequence[Peer],
    runtime: OrtRuntime,
    lengths: list[int],
    blocks: int,
    log: Callable[[str], None],
) -> list[dict]:
    """One request at a time, every server in turn within a block (the order rotates); each
    row's floor (ORT's run of the same graph in this process, plus a bare gRPC echo of
    attnserve's answer's bytes: a server with no code of its own) in the same blocks."""
    longest = lengths[-1]
    cases = [(t, "none", 40 if t < longest else 10) for t in lengths]
    cases += [(longest, attention, 3) for attention in (F32, *PACKED_MAPS)]
    names = [ATTNSERVE, *(peer.kind.name for peer in peers)]
    times: dict[tuple[int, str], dict[str, list[float]]] = {
        (t, a): {name: [] for name in [*names, "runtime", "echo"]} for t, a, _ in cases
    }
    answer_bytes: dict[tuple[int, str], int] = {}
    with asyncio.Runner() as runner, echo_server() as echo_address:
        # One client and one channel each for the whole run, as the peers' driver keeps its own.
        client = AsyncEncoderClient(address, ClientOptions(timeout_s=120))
        echo = Echo(echo_address)
        for seq_len, attention, _ in cases:
            ids = [i % 256 for i in range(seq_len)]  # the others' ids are under 256 too
            output = runner.run(client.encode([ids], **MAP_OPTIONS.get(attention, {})))
            answer_bytes[seq_len, attention] = output.wire_bytes
        for block in range(blocks):
            for seq_len, attention, n in cases:
                shift = block % len(names)
                for name in names[shift:] + names[:shift]:
                    if name == ATTNSERVE:
                        options = MAP_OPTIONS.get(attention, {})
                        ms = runner.run(encode_ms(client, seq_len, n, **options))
                    elif attention in PACKED_MAPS:
                        continue  # the peers have no such answer
                    else:
                        peer = next(p for p in peers if p.kind.name == name)
                        wants = attention != "none"
                        ms = peer.ask("latency", seq_len=seq_len, n=n, attention=wants)["ms"]
                    times[seq_len, attention][name] += ms
                floor, size = times[seq_len, attention], answer_bytes[seq_len, attention]
                if attention == "none":
                    run_ms, echo_ms = runner.run(_in_turn_ms(runtime, echo, seq_len, size, n))
                else:
                    run_ms = runtime_ms(runtime, seq_len, n)
                    echo_ms = [runner.run(echo.ms(size)) for _ in range(n)]
                floor["runtime"] += run_ms
                floor["echo"] += echo_ms
            log(f"  latency block {block + 1}/{blocks}")
        runner.run(client.close())
        runner.run(echo.close())
    rows = []
    for (seq_len, attention), by_server in times.items():
        servers = {name: _percentile_row(ms) for name, ms in by_server.items() if ms}
        floors = {name: servers.pop(name) for name in ("runtime", "echo")}
        floor_ms = floors["runtime"]["p50_ms"] + floors["echo"]["p50_ms"]
        ours = servers[ATTNSERVE]["p50_ms"]
        row: dict = {
            "seq_len": seq_len,
            "attention": attention,
            "servers": servers,
            "floor": {
                "bytes": answer_bytes[seq_len, attention],
                **floors,
                "p50_ms": floor_ms,
                "in_turn": attention == "none",
            },
            "vs_floor": round(ours / floor_ms, 3),
        }
        if len(servers) > 1:
            best = _best_peer(servers)
            row["best_peer"] = best
            row["p50_ratio"] = round(ours / servers[best]["p50_ms"], 3)
            row["p99_ratio"] = round(
                servers[ATTNSERVE]["p99_ms"] / servers[_best_peer(servers, "p99_ms")]["p99_ms"], 3
            )
            # What a server with no code of its own would reach against the same peer.
            row["floor_vs_best_peer"] = round(floor_ms / servers[best]["p50_ms"], 3)
        rows.append(row)
    return rows


async def _in_turn_ms(
    runtime: OrtRuntime, echo: Echo, seq_len: int, size: int, n: int
) -> tuple[list[float], list[float]]:
    """The embeddings' floor as a server meets it: ORT's run of the embeddings graph, then an
    echo of the answer's `size` bytes, `n` times in turn. Each alone, back to back, runs in
    caches the other would have cooled: faster than in any server. Each part's ms."""
    ids = np.random.default_rng(seq_len).integers(0, 256, size=(1, seq_len))
    runtime.embed(ids)
    runs, echoes = [], []
    for _ in range(n):
        start = time.perf_counter()
        runtime.embed(ids)
        runs.append((time.perf_counter() - start) * 1e3)
        echoes.append(await echo.ms(size))
    return runs, echoes


def _closed_loop(address: str, mixed: list[int], duration: float) -> dict:
    mix = [RequestKind(t) for t in mixed]
    warm_up = LoadGenerator(address, mix, seed=SEED + 1)  # other draws
    asyncio.run(warm_up.closed_loop(CONCURRENCY, 1.0, progress=False))
    generator = LoadGenerator(address, mix, seed=SEED)
    records, elapsed = asyncio.run(generator.closed_loop(CONCURRENCY, duration, progress=False))
    ok = [r for r in records if r.status == "OK"]
    tokens = sum(mixed[r.kind] for r in ok)
    return {**_rates(tokens, len(ok), elapsed), "errors": len(records) - len(ok)}


def _peer_closed_loop(peer: Peer, mixed: list[int], duration: float) -> dict:
    loop = {"concurrency": CONCURRENCY, "lengths": mixed}
    peer.ask("closed", duration=1.0, seed=SEED + 1, **loop)  # warm-up on other draws
    r = peer.ask("closed", duration=duration, seed=SEED, **loop)
    return {**_rates(r["tokens"], r["requests"], r["elapsed"]), "errors": r["errors"]}


def _draws(mixed: list[int], count: int = 4096) -> list[np.ndarray]:
    """The ids LoadGenerator(mix of `mixed`, seed SEED) sends, in its order."""
    kind_rng = np.random.default_rng([SEED, 1])
    data_rng = np.random.default_rng([SEED, 2])
    data = [data_rng.integers(0, 256, size=n) for n in mixed]
    uniform = np.full(len(mixed), 1 / len(mixed))
    return [data[int(kind_rng.choice(len(mixed), p=uniform))] for _ in range(count)]


def _rates(tokens: int, requests: int, elapsed: float) -> dict:
    return {
        "tokens_per_s": round(tokens / elapsed, 1),
        "requests_per_s": round(requests / elapsed, 1),
    }


def _in_process_one_at_a_time(runtime: OrtRuntime, mixed: list[int], duration: float) -> dict:
    draws, tokens, requests = _draws(mixed), 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < duration:
        ids = draws[requests % len(draws)]
        runtime.embed(ids[None, :])
        tokens, requests = tokens + len(ids), requests + 1
    return _rates(tokens, requests, time.perf_counter() - start)


async def _in_process_batched(
    runtime: OrtRuntime, instances: list[OrtRuntime], mixed: list[int], duration: float
) -> dict:
    """The same draws through the batcher and the instances, `CONCURRENCY` in flight."""
    metrics = Metrics().for_model(runtime.config.name, "1")
    batcher = Engine(runtime, BatcherOptions(max_queue=1024), metrics, instances=instances)
    batcher.start()
    draws, tokens, requests = _draws(mixed), 0, 0

    async def worker() -> None:
        nonlocal tokens, requests
        while time.perf_counter() - start < duration:
            ids = draws[requests % len(draws)]
            requests += 1
            await batcher.encode([ids])
            tokens += len(ids)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    elapsed = time.perf_counter() - start
    await batcher.stop()
    return _rates(tokens, requests, elapsed)


IN_PROCESS = ("ORT in process, one at a time", "ORT in process, batcher")


def measure_saturation(
    model_dir: Path,
    peers: Sequence[Peer],
    runtime: OrtRuntime,
    mixed: list[int],
    duration: float,
    rounds: int,
    log: Callable[[str], None],
) -> dict:
    """Every engine on the same closed loop, in turn, `rounds` times; medians."""
    # The server's own instances (by default one per core, a thread each), warmed as it warms.
    settings = Settings(model=model_dir, provider="cpu")
    instances = model_instances(ModelDirectory(model_dir), settings, "cpu")
    for instance in instances:
        instance.warmup()
    runs: dict[str, list[dict]] = {}
    for round_ in range(rounds):
        with serve_attnserve(model_dir) as address:
            runs.setdefault(ATTNSERVE, []).append(_closed_loop(address, mixed, duration))
        for peer in peers:
            runs.setdefault(peer.kind.name, []).append(_peer_closed_loop(peer, mixed, duration))
        runs.setdefault(IN_PROCESS[0], []).append(
            _in_process_one_at_a_time(runtime, mixed, duration)
        )
        runs.setdefault(IN_PROCESS[1], []).append(
            asyncio.run(_in_process_batched(runtime, instances, mixed, duration))
        )
        log(
            f"  saturation round {round_ + 1}/{rounds}: "
            + ", ".join(f"{name} {r[-1]['tokens_per_s']:.0f}" for name, r in runs.items())
        )
    engines = {
        name: {
            "tokens_per_s": float(np.median([r["tokens_per_s"] for r in rs])),
            "requests_per_s": float(np.median([r["requests_per_s"] for r in rs])),
            "errors": sum(r.get("errors", 0) for r in rs),
            "runs": [r["tokens_per_s"] for r in rs],
        }
        for name, rs in runs.items()
    }
    ours = engines[ATTNSERVE]["tokens_per_s"]
    best = max((p.kind.name for p in peers), key=lambda n: engines[n]["tokens_per_s"])
    return {
        "concurrency": CONCURRENCY,
        "lengths": [mixed[0], mixed[-1]],
        "duration_s": duration,
        "rounds": rounds,
        "engines": engines,
        "best_peer": best,
        "vs_best_peer": round(ours / engines[best]["tokens_per_s"], 3),
        "vs_best_in_process": round(ours / max(engines[n]["tokens_per_s"] for n in IN_PROCESS), 3),
    }


def measure_open_loop(
    address: str, peer: Peer, mixed: list[int], rate: float, duration: float
) -> dict:
    """Poisson arrivals at `rate` on the mixed lengths: latency from the intended send time."""
    generator = LoadGenerator(address, [RequestKind(t) for t in mixed], seed=SEED)
    records, _ = asyncio.run(generator.open_loop(rate, duration, progress=False))
    ours = summarize(records, duration)
    theirs = peer.ask("open", rate=rate, duration=duration, seed=SEED, lengths=mixed)
    a = {
        "p50_ms": ours["latency_ms"]["p50"],
        "p99_ms": ours["latency_ms"]["p99"],
        "errors": sum(ours["errors"].values()),
    }
    k = {**_percentile_row(theirs["ms"]), "errors": theirs["errors"]}
    return {
        "rate_per_s": round(rate, 2),
        "duration_s": duration,
        "peer": peer.kind.name,
        ATTNSERVE: a,
        "theirs": k,
        "p99_ratio": round(a["p99_ms"] / k["p99_ms"], 3),
    }


def run_peers(
    out: Path,
    model_dir: Path,
    root: Path = Path("."),
    duration: float = 10.0,
    blocks: int = 5,
    rounds: int = 3,
    log: Callable[[str], None] = print,
    kinds: Sequence[PeerKind] = PEERS,
    big_map: bool = True,
) -> dict:
    """The whole comparison; the peers' environments live under `root` (made once)."""
    out.mkdir(parents=True, exist_ok=True)  # before the run: its scratch goes beside `out`
    keep_freed_heap()  # attnserve's client, as its docs advise for large maps (and the floors)
    driver = peer_venv(root / KSERVE.venv, log)  # tritonclient, for every peer
    pythons = {kind: peer_venv(root / kind.venv, log, kind.pins) for kind in kinds}
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    longest = min(LONGEST, runtime.config.max_seq_len)
    lengths = sorted({min(t, longest) for t in LATENCY_LENGTHS})
    mixed = list(range(SHORTEST, longest + 1))
    with contextlib.ExitStack() as stack:
        peers = []
        for kind, python in pythons.items():
            peer = Peer(kind, python, model_dir, runtime, driver)
            stack.callback(peer.close)
            peers.append(peer)
        with serve_attnserve(model_dir) as address:
            log("peers: latency, one request at a time")
            latency = measure_latency(address, peers, runtime, lengths, blocks, log)
        log("peers: saturation")
        saturation = measure_saturation(model_dir, peers, runtime, mixed, duration, rounds, log)
        best = next(p for p in peers if p.kind.name == saturation["best_peer"])
        rate = OPEN_LOOP_SHARE * saturation["engines"][best.kind.name]["requests_per_s"]
        log(f"peers: open loop at {rate:.1f} requests/s")
        with serve_attnserve(model_dir) as address:
            open_loop = measure_open_loop(address, best, mixed, rate, 2 * duration)
    result = {
        "machine": {"cpus": len(os.sched_getaffinity(0)), "cpu": platform.processor()},
        "versions": {
            **{kind.name: " ".join(kind.pins) for kind in kinds},
            "onnxruntime": metadata.version(ort_distribution()),
            "python": platform.python_version(),
        },
        "latency": latency,
        "saturation": saturation,
        "open_loop": open_loop,
    }
    if big_map:
        with tempfile.TemporaryDirectory(dir=out.parent) as work:
            result["big_map"] = measure_big_map(Path(work).resolve(), 3, log)
    save(out, "peers", result, table(result))
    return result


def targets(result: dict) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for each of issue 53's targets that the run measured."""
    lat, s = result["latency"], result["saturation"]
    plain = [r for r in lat if r["attention"] == "none" and "p50_ratio" in r]
    rows = []
    for limit in sorted(set(P50_TARGETS.values())):
        at = [r for r in plain if P50_TARGETS.get(r["seq_len"]) == limit]
        if at:
            lengths = ", ".join(str(r["seq_len"]) for r in at)
            rows.append(
                (
                    f"p50 <= {limit:.1f}x the best peer's at T = {lengths}",
                    ", ".join(f"{r['p50_ratio']:.2f}x" for r in at)
                    + " (runtime + echo: "
                    + ", ".join(f"{r['floor_vs_best_peer']:.2f}x" for r in at)
                    + ")",
                    all(r["p50_ratio"] <= limit for r in at),
                )
            )
    rows.append(
        (
            "saturated tokens/s >= 1.2x the best peer's",
            f"{s['vs_best_peer']:.2f}x ({s['best_peer']})",
            s["vs_best_peer"] >= 1.2,
        )
    )
    for row in lat:
        if row["attention"] == F32 and "p50_ratio" in row:
            rows.append(
                (
                    f"every attention weight, float32, T = {row['seq_len']}: <= 1.0x the best "
                    "peer's p50",
                    f"{row['p50_ratio']:.2f}x ({row['best_peer']})",
                    row["p50_ratio"] <= 1.0,
                )
            )
        if row["attention"] in PACKED_MAPS:
            kept = ", kept packed" if row["attention"] == F16_KEPT else ""
            rows.append(
                (
                    f"float16 causal-packed, T = {row['seq_len']}: <= 1.3x the runtime + "
                    f"echo{kept}",
                    f"{row['vs_floor']:.2f}x",
                    row["vs_floor"] <= 1.3,
                )
            )
    if "big_map" in result:
        rows += big_map_targets(result["big_map"])
    return rows


def table(result: dict) -> str:
    """The measurements and the targets as markdown."""
    v = result["versions"]
    names = list(result["latency"][0]["servers"])
    lines = [
        "Peers: "
        + "; ".join(f"{n}: {v[n]}" for n in names if n in v)
        + f". ONNX Runtime {v['onnxruntime']}, the same graphs and session settings.",
        "",
        "| request | "
        + " | ".join(f"{n} p50 / p99 ms" for n in names)
        + " | runtime + echo p50 ms | attnserve / best peer p50 | attnserve / runtime + echo |",
        "|---|" + "---|" * (len(names) + 3),
    ]
    for row in result["latency"]:
        what = f"T={row['seq_len']}" + (
            f", {row['attention']}" if row["attention"] != "none" else ""
        )
        cells = [
            f"{row['servers'][n]['p50_ms']:.2f} / {row['servers'][n]['p99_ms']:.2f}"
            if n in row["servers"]
            else "-"
            for n in names
        ]
        floor = row["floor"]
        cells.append(
            f"{floor['runtime']['p50_ms']:.2f} + {floor['echo']['p50_ms']:.2f} "
            f"({_size(floor['bytes'])}{', in turn' if floor['in_turn'] else ''})"
        )
        cells.append(f"{row['p50_ratio']:.2f}x ({row['best_peer']})" if "p50_ratio" in row else "-")
        cells.append(f"{row['vs_floor']:.2f}x")
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    s = result["saturation"]
    lines += [
        "",
        f"Saturated, {s['concurrency']} in flight, lengths uniform in "
        f"{s['lengths'][0]}..{s['lengths'][1]} (same draws; median of {s['rounds']} rounds "
        f"of {s['duration_s']:g} s):",
        "",
        "| engine | tokens/s | requests/s | attnserve / it |",
        "|---|---|---|---|",
    ]
    ours = s["engines"][ATTNSERVE]["tokens_per_s"]
    for name, e in s["engines"].items():
        lines.append(
            f"| {name} | {e['tokens_per_s']:,.0f} | {e['requests_per_s']:.1f} | "
            f"{ours / e['tokens_per_s']:.2f}x |"
        )
    o = result["open_loop"]
    lines += [
        "",
        f"Open loop (Poisson) at {o['rate_per_s']:.1f} requests/s (70% of {o['peer']}'s "
        f"saturated rate), {o['duration_s']:g} s, same mix: attnserve p50 "
        f"{o[ATTNSERVE]['p50_ms']:.1f} ms / p99 {o[ATTNSERVE]['p99_ms']:.1f} ms, {o['peer']} "
        f"p50 {o['theirs']['p50_ms']:.1f} ms / p99 {o['theirs']['p99_ms']:.1f} ms: p99 ratio "
        f"{o['p99_ratio']:.2f}x.",
    ]
    if "big_map" in result:
        lines += ["", big_map_summary(result["big_map"])]
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    lines += [
        f"| {name} | {measured} | {'yes' if met else '**no**'} |"
        for name, measured, met in targets(result)
    ]
    return "\n".join(lines)
