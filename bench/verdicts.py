"""What one benchmark run says: each target's verdict and the comparisons between
engines, computed from that run's results only (bench/render.py lays them out)."""

from __future__ import annotations

from attnserve.bench.engines import FLOORS
from attnserve.bench.grpc_e2e import SHAPES
from attnserve.bench.latency import Row


class Results:
    def __init__(
        self,
        rows: list[Row],
        env: dict,
        grpc: dict,
        batching: dict,
        hf: dict | None = None,
        containers: dict | None = None,
        attention: dict | None = None,
    ) -> None:
        self.rows, self.env, self.grpc, self.batching = rows, env, grpc, batching
        self.hf, self.containers, self.attention = hf, containers, attention
        self._index = {(r.engine, r.batch, r.seq_len): r for r in rows}

    def p50(self, engine: str, seq_len: int, batch: int = 1) -> float | None:
        row = self._index.get((engine, batch, seq_len))
        return row.p50_ms if row else None

    def ratio(self, slow: str, fast: str, seq_len: int, batch: int = 1) -> float | None:
        a, b = self.p50(slow, seq_len, batch), self.p50(fast, seq_len, batch)
        return a / b if a and b else None

    def seq_lens(self, batch: int = 1) -> list[int]:
        return sorted({r.seq_len for r in self.rows if r.batch == batch})

    def engines(self) -> list[str]:
        return sorted({r.engine for r in self.rows})


def _fmt(x: float | None, spec: str = ".2f", unit: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{unit}"


def targets(res: Results) -> list[tuple[str, str, bool | None]]:
    """(target, what was measured, met?) for every target of the benchmark issue."""
    lens = res.seq_lens()
    ratios = {t: res.ratio("torch-eager", "ort-cpu", t) for t in lens}
    worst = min((r for r in ratios.values() if r), default=None)
    long = [(t, b) for b in (1, 8) for t in res.seq_lens(b) if t >= 512]
    peak_pcts = [
        res._index[("ort-cpu", b, t)].pct_of_peak
        for t, b in long
        if ("ort-cpu", b, t) in res._index
    ]
    overheads = [
        r["overhead_p50_ms"] for r in res.grpc["embeddings_overhead"] if r["seq_len"] <= 128
    ]
    speedup = res.batching["speedup"]
    compile_ratios = [res.ratio("torch-eager", "torch-compile", t) for t in lens]
    compile_ratios = [r for r in compile_ratios if r]
    return [
        (
            "ORT CPU >= 2x PyTorch eager at every length (batch 1)",
            f"{_fmt(worst, '.1f', 'x')} at worst; "
            + ", ".join(f"{t}: {_fmt(r, '.1f', 'x')}" for t, r in ratios.items()),
            worst is not None and worst >= 2,
        ),
        (
            "torch.compile: where it stands",
            f"{min(compile_ratios):.1f}x-{max(compile_ratios):.1f}x eager"
            if compile_ratios
            else "did not run here",
            None,
        ),
        (
            "ORT >= 70% of the matmul peak at length >= 512",
            (", ".join(f"{p:.0f}%" for p in peak_pcts) or "no length >= 512 measured")
            + f" of {res.env['matmul_peak_gflops']:.0f} GFLOP/s",
            bool(peak_pcts) and min(peak_pcts) >= 70,
        ),
        (
            "gRPC overhead <= 0.35 ms p50 up to length 128",
            f"{min(overheads):.2f}-{max(overheads):.2f} ms (empty RPC: "
            f"{res.grpc['empty_rpc_p50_ms']:.2f} ms)",
            max(overheads) <= 0.35,
        ),
        (
            f"batching >= 1.8x req/s at concurrency {res.batching['concurrency']}, "
            f"length {res.batching['seq_len']}",
            f"{_fmt(speedup, '.2f', 'x')}",
            speedup is not None and speedup >= 1.8,
        ),
        *_transport_targets(res),
        *_attention_targets(res),
    ]


def attention_mode(res: Results, mode: str, seq_len: int) -> dict | None:
    modes = (res.attention or {}).get("modes", [])
    return next((r for r in modes if r["mode"] == mode and r["seq_len"] == seq_len), None)


def _attention_targets(res: Results) -> list[tuple[str, str, bool | None]]:
    """The targets of "attention you can afford" (where this run has them)."""
    out = []
    for mode, limit in (("all heads, f16 packed", 1.5), ("last row", 1.1), ("rollout", 1.2)):
        row = attention_mode(res, mode, 512)
        if row:
            ratio = row["grpc_p50_ms"] / row["runtime_p50_ms"]  # unrounded: 1.204 is over 1.2
            out.append(
                (
                    f"attention at 512 tokens, {mode} (all layers): Encode <= {limit}x the runtime",
                    f"{ratio:.3f}x ({row['grpc_p50_ms']:.1f} / {row['runtime_p50_ms']:.1f} ms)",
                    ratio <= limit,
                )
            )
    burst = next(
        (b for b in (res.attention or {}).get("burst", []) if "(default)" in b["variant"]), None
    )
    if burst:
        out.append(
            (
                f"burst of {burst['requests']} x {burst['seq_len']} tokens, all attention: no "
                "errors, RSS peak <= +1.5 GiB, <= +300 MiB 10 s after",
                f"{burst['errors']} errors, {burst['peak_over_baseline_mib']:+d} MiB peak, "
                f"{burst['after_over_baseline_mib']:+d} MiB after",
                burst["errors"] == 0
                and burst["peak_over_baseline_mib"] <= 1536
                and burst["after_over_baseline_mib"] <= 300,
            )
        )
    return out


def _transport_targets(res: Results) -> list[tuple[str, str, bool | None]]:
    """The targets of "the server adds little to the transport" (where this run has them)."""
    out = []
    eager_8 = res.ratio("torch-eager", "ort-cpu", 8)
    if eager_8:
        eager, ort = res.p50("torch-eager", 8), res.p50("ort-cpu", 8)
        measured = f"{eager_8:.2f}x ({eager:.2f} vs {ort:.2f} ms)"  # two decimals: 3.96 is no 4.0
        out.append(("ORT CPU >= 4x PyTorch eager at 8 tokens", measured, eager_8 >= 4))
    floor = {t: res.ratio("ort-cpu", "matmul-only", t) for t in (128, 256, 512)}
    floor = {t: r for t, r in floor.items() if r}
    ort_floor = {t: res.ratio("ort-cpu", "ort-matmul-only", t) for t in floor}
    if floor:
        out.append(
            (
                "full graph (embeddings + attention) <= 1.15x the matmul floor at 128..512",
                ", ".join(f"{t}: {r:.2f}x" for t, r in floor.items())
                + (
                    "; against ORT's own MatMul nodes (`ort-matmul-only`): "
                    + ", ".join(f"{t}: {r:.2f}x" for t, r in ort_floor.items())
                    if all(ort_floor.values())
                    else ""
                ),
                max(floor.values()) <= 1.15,
            )
        )
    rows = [r for r in res.grpc["embeddings_overhead"] if r["seq_len"] in (8, 32, 128)]
    if rows and all("overhead_to_bare" in r for r in rows):
        out.append(
            (
                "(Encode - runtime) <= 1.5x a bare gRPC round trip of the same bytes at 8, 32, 128",
                ", ".join(
                    f"{r['seq_len']}: {r['overhead_to_bare']:.2f}x "
                    f"({r['overhead_p50_ms']:.2f} / {r['bare_grpc_p50_ms']:.2f} ms)"
                    for r in rows
                )
                + (
                    "; the best of three Python servers that only run the model: "
                    + ", ".join(f"{r['best_python_overhead_to_bare']:.2f}x" for r in rows)
                    if all("best_python_overhead_to_bare" in r for r in rows)
                    else ""
                ),
                max(r["overhead_to_bare"] for r in rows) <= 1.5,
            )
        )
    stream = res.grpc.get("stream_vs_unary")
    if stream:
        out.append(
            (
                f"a stream of {stream['requests']} short requests >= 2x faster than "
                "sequential Encode calls",
                f"{stream['speedup']:.2f}x ({stream['stream_ms']:.0f} vs "
                f"{stream['unary_ms']:.0f} ms)",
                stream["speedup"] >= 2,
            )
        )
    return out


def comparisons(res: Results) -> list[str]:
    """One sentence per comparison, each computed from this run's numbers."""
    lens = res.seq_lens()
    out = []
    ratios = {t: res.ratio("torch-eager", "ort-cpu", t) for t in lens}
    at_least_2 = [t for t, r in ratios.items() if r and r >= 2]
    out.append(
        "`ort-cpu` vs `torch-eager`, batch 1: "
        + ", ".join(f"{_fmt(r, '.2f', 'x')} at {t}" for t, r in ratios.items())
        + f"; at least 2x at {', '.join(map(str, at_least_2)) or 'no length'}."
    )
    floor = {t: res.ratio("ort-cpu", "matmul-only", t) for t in lens}
    out.append(
        "`ort-cpu` / `matmul-only` (the model's matrix products alone), batch 1: "
        + ", ".join(f"{_fmt(r, '.2f', 'x')} at {t}" for t, r in floor.items())
        + "."
    )
    ort_floor = {t: res.ratio("ort-cpu", "ort-matmul-only", t) for t in lens}
    if any(ort_floor.values()):
        out.append(
            "`ort-cpu` / `ort-matmul-only` (the same products as ONNX Runtime MatMul nodes), "
            "batch 1: "
            + ", ".join(f"{_fmt(r, '.2f', 'x')} at {t}" for t, r in ort_floor.items())
            + "."
        )
    below = {}
    for t in lens:
        m = res.p50("matmul-only", t)
        faster = [e for e in res.engines() if e not in FLOORS and (res.p50(e, t) or 1e9) < m]
        if m and faster:
            below[t] = faster
    out.append(
        "Engines with a lower p50 than `matmul-only` (batch 1): "
        + (
            "; ".join(f"{t}: {', '.join(f'`{e}`' for e in e_)}" for t, e_ in below.items())
            or "none"
        )
        + "."
    )
    emb = {t: res.ratio("ort-cpu", "ort-cpu-emb", t) for t in lens if t >= 128}
    out.append(
        "`ort-cpu` / `ort-cpu-emb` (full graph vs embeddings-only graph), batch 1: "
        + ", ".join(f"{_fmt(r, '.2f', 'x')} at {t}" for t, r in emb.items())
        + "."
    )
    traced = {t: res.ratio("ort-cpu-traced", "ort-cpu", t) for t in lens}
    if any(traced.values()):
        out.append(
            "`ort-cpu-traced` / `ort-cpu` (the traced full graph vs the fused one), batch 1: "
            + ", ".join(f"{_fmt(r, '.2f', 'x')} at {t}" for t, r in traced.items())
            + "."
        )
    spin = {t: res.ratio("ort-cpu-nospin", "ort-cpu", t) for t in lens if t <= 64}
    out.append(
        "`ort-cpu-nospin` / `ort-cpu` (intra-op spinning off vs on during a run), batch 1: "
        + ", ".join(f"{_fmt(r, '.2f', 'x')} at {t}" for t, r in spin.items())
        + "."
    )
    g = res.grpc
    overheads = [r["overhead_p50_ms"] for r in g["embeddings_overhead"]]
    per_floor = [o / g["empty_rpc_p50_ms"] for o in overheads]
    out.append(
        f"gRPC Encode minus the runtime alone: {min(overheads):.2f}-{max(overheads):.2f} ms, "
        f"{min(per_floor):.1f}x-{max(per_floor):.1f}x the empty RPC's "
        f"{g['empty_rpc_p50_ms']:.2f} ms."
    )
    rows = [r for r in g["embeddings_overhead"] if "best_python_overhead_to_bare" in r]
    if rows:
        out.append(
            "(Encode - runtime alone) / bare round trip, this server: "
            + ", ".join(f"{r['overhead_to_bare']:.2f}x at {r['seq_len']}" for r in rows)
            + "; Python servers that only run the model, "
            + "; ".join(
                f"{way}: " + ", ".join(f"{r[f'{name}_overhead_to_bare']:.2f}x" for r in rows)
                for name, way in SHAPES.items()
            )
            + "; the worker-thread one's two legs alone, over the bare round trip: "
            + ", ".join(f"{r['minimal_legs_to_bare']:.2f}x" for r in rows)
            + "."
        )
    pauses = g.get("runtime_after_pause") or []
    if pauses:
        inside = next((r for r in g["embeddings_overhead"] if r["seq_len"] == 8), None)
        out.append(
            "The 8-token run in process, after a pause of "
            + ", ".join(f"{r['pause_ms']:g}" for r in pauses[1:])
            + " ms: "
            + ", ".join(f"{r['to_back_to_back']:.2f}x" for r in pauses[1:])
            + f" the back-to-back run ({pauses[0]['runtime_p50_ms']:.2f} ms)"
            + (
                f"; ORT inside the server: {inside['server_inference_p50_ms']:.2f} ms"
                if inside
                else ""
            )
            + "; one ORT thread spinning through the pause instead of sleeping: "
            + ", ".join(f"{r['spinning_to_back_to_back']:.2f}x" for r in pauses[1:])
            + f" its back-to-back run ({pauses[0]['spinning_one_thread_p50_ms']:.2f} ms)."
        )
    http = g.get("http_vs_grpc") or []
    if http:
        out.append(
            "HTTP `/v1/embeddings` / gRPC `Encode`, the same pooled vector: "
            + ", ".join(
                f"{r['http_p50_ms'] / r['grpc_p50_ms']:.2f}x at {r['seq_len']}" for r in http
            )
            + " (base64: "
            + ", ".join(
                f"{r['http-base64_p50_ms'] / r['grpc_p50_ms']:.2f}x at {r['seq_len']}" for r in http
            )
            + ")."
        )
    full, packed = (
        attention_mode(res, m, 512) for m in ("all heads, f32 full", "all heads, f16 packed")
    )
    if full and packed:
        out.append(
            f"Attention at 512 tokens, all layers and heads: float32 full is "
            f"{full['response_bytes'] / 1e6:.1f} MB and {full['ratio_to_runtime']:.2f}x the "
            f"runtime; float16 causal-packed is {packed['response_bytes'] / 1e6:.1f} MB "
            f"({full['response_bytes'] / packed['response_bytes']:.1f}x fewer bytes) and "
            f"{packed['ratio_to_runtime']:.2f}x."
        )
    on, off = (res.batching["variants"][k] for k in ("batching on", "batching off"))
    out.append(
        f"Batching on / off at concurrency {res.batching['concurrency']}: "
        f"{on['achieved_rate']:.0f} / {off['achieved_rate']:.0f} req/s "
        f"({_fmt(res.batching['speedup'], '.2f', 'x')}); p99 {on['latency_ms']['p99']:.0f} / "
        f"{off['latency_ms']['p99']:.0f} ms."
    )
    return out
