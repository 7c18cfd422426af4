"""Renders docs/BENCHMARKS.md's generated part from one run's results (bench/suite.py runs it).

Everything generated is a table of measurements or a comparison computed from
them, so each sentence is true of that run by construction. What the numbers
mean (why a target is missed, what would close it) is prose a person writes
below the generated part, citing the run; rendering keeps that part as it is.
"""

from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path

from attnserve.bench.containers import markdown as containers_markdown
from attnserve.bench.containers import ratios as container_ratios
from attnserve.bench.engines import DESCRIPTIONS
from attnserve.bench.grpc_e2e import BREAKDOWN_PLOT
from attnserve.bench.grpc_e2e import markdown as grpc_markdown
from attnserve.bench.hf_compare import markdown as hf_markdown
from attnserve.bench.latency import Row, markdown_table

COMMAND = (
    "make benchmarks   # = attnserve bench report --out bench-results --doc docs/BENCHMARKS.md"
)
# The generated part of the page ends here; what follows the marker is written by hand.
END_OF_GENERATED = "<!-- end of the generated part: what follows is written by hand -->"


class Results:
    def __init__(
        self,
        rows: list[Row],
        env: dict,
        grpc: dict,
        batching: dict,
        hf: dict | None = None,
        containers: dict | None = None,
    ) -> None:
        self.rows, self.env, self.grpc, self.batching = rows, env, grpc, batching
        self.hf, self.containers = hf, containers
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
    packed = next(r for r in res.grpc["attention"] if r["variant"] == "float16 causal-packed")
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
            f"attention at {packed['seq_len']}, float16 causal-packed <= 1.5x the runtime",
            f"{packed['ratio_to_runtime']:.2f}x",
            packed["ratio_to_runtime"] <= 1.5,
        ),
        (
            f"batching >= 1.8x req/s at concurrency {res.batching['concurrency']}, "
            f"length {res.batching['seq_len']}",
            f"{_fmt(speedup, '.2f', 'x')}",
            speedup is not None and speedup >= 1.8,
        ),
        *_transport_targets(res),
    ]


def _transport_targets(res: Results) -> list[tuple[str, str, bool | None]]:
    """The targets of "the server adds little to the transport" (where this run has them)."""
    out = []
    eager_8 = res.ratio("torch-eager", "ort-cpu", 8)
    if eager_8:
        out.append(("ORT CPU >= 4x PyTorch eager at 8 tokens", f"{eager_8:.1f}x", eager_8 >= 4))
    floor = {t: res.ratio("ort-cpu", "matmul-only", t) for t in (128, 256, 512)}
    floor = {t: r for t, r in floor.items() if r}
    if floor:
        out.append(
            (
                "full graph (embeddings + attention) <= 1.15x the matmul floor at 128..512",
                ", ".join(f"{t}: {r:.2f}x" for t, r in floor.items()),
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
                ),
                max(r["overhead_to_bare"] for r in rows) <= 1.5,
            )
        )
    saturation = res.batching.get("saturation")
    if saturation:
        served, bare = saturation["server"], saturation["bare"]
        out.append(
            (
                f"saturated server (closed loop x{saturation['concurrency']}, lengths "
                f"{saturation['lengths'][0]}..{saturation['lengths'][-1]}) >= 85% of the bare "
                "runtime's tokens/s",
                f"{saturation['share']:.0%} ({served['tokens_per_s']:.0f} vs "
                f"{bare['tokens_per_s']:.0f} tokens/s)",
                saturation["share"] >= 0.85,
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
    below = {}
    for t in lens:
        m = res.p50("matmul-only", t)
        faster = [e for e in res.engines() if e != "matmul-only" and (res.p50(e, t) or 1e9) < m]
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
    spin = {t: res.ratio("ort-cpu", "ort-cpu-spin", t) for t in lens if t <= 64}
    out.append(
        "`ort-cpu` / `ort-cpu-spin` (intra-op spinning off vs on), batch 1: "
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
        next(r for r in g["attention"] if r["variant"] == v)
        for v in ("float32 full", "float16 causal-packed")
    )
    out.append(
        f"Attention at {full['seq_len']} tokens, all layers and heads: float32 full is "
        f"{full['response_bytes'] / 1e6:.1f} MB and {full['ratio_to_runtime']:.2f}x the runtime; "
        f"float16 causal-packed is {packed['response_bytes'] / 1e6:.1f} MB "
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


def _breakdown_picture(out: Path) -> str:
    if not (out / BREAKDOWN_PLOT).exists():
        return ""
    return f"""
![Where one Encode's time goes: the model, the server, the transport]({BREAKDOWN_PLOT})
"""


def _saturation_section(res: Results) -> str:
    s = res.batching.get("saturation")
    if not s:
        return ""
    rows = "\n".join(
        f"| {name} | {r['tokens_per_s']:.0f} | {r['requests_per_s']:.1f} | "
        f"{r['mean_batch_size']} | {r['errors']} |"
        for name, r in (("server (gRPC, own process)", s["server"]), ("bare", s["bare"]))
    )
    return f"""
Saturation: a closed loop of {s["concurrency"]} requests in flight, lengths drawn evenly from
{", ".join(map(str, s["lengths"]))}, embeddings only, {s["duration_s"]:.0f} s each, against the
server, then the same draws in-process straight on the batcher and the runtime (same
policy and concurrency, no transport, no client process beside it).

| closed loop | tokens/s | req/s | mean batch size | errors |
|---|---|---|---|---|
{rows}
"""


def render(res: Results, out: Path, plot_name: str) -> str:
    env = res.env
    unavailable = env.get("unavailable_engines", {})
    engines = "\n".join(
        f"- `{name}`: {text}"
        + (f" (**not run here**: {unavailable[name]})" if name in unavailable else "")
        for name, text in DESCRIPTIONS.items()
    )
    target_rows = "\n".join(
        f"| {name} | {measured} | {'-' if met is None else 'yes' if met else '**no**'} |"
        for name, measured, met in targets(res)
    )
    on, off = (res.batching["variants"][k] for k in ("batching on", "batching off"))
    batch_sizes = sorted({r.batch for r in res.rows})
    latency_tables = "\n\n".join(
        f"### Batch {b}\n\n{markdown_table(res.rows, b)}" for b in batch_sizes
    )
    return f"""\
# Benchmarks

Generated by one command, which reruns everything below (about 20 minutes on 2 cores):

    {COMMAND}

Raw results (JSON, CSV) land in `{out}/`. Every engine runs the same weights
on the same inputs in the same run; read the **ratios**: the machines are
shared and noisy, absolute times move between runs.

| machine | |
|---|---|
| CPU | {env["cpu"]}, {env["cores"]} cores |
| fp32 matmul peak (torch, 2048^2, this run) | {env["matmul_peak_gflops"]:.0f} GFLOP/s |
| software | Python {env["python"]}, torch {env["torch"]}, onnxruntime {env["onnxruntime"]} |
| model | default config (4 layers, 8 heads, d_model 256, d_ff 1024), random weights, seed 0 |
| run | {datetime.date.today().isoformat()} |

## Targets

| target | measured | met |
|---|---|---|
{target_rows}

## Latency across sequence lengths

p50 per call; in parentheses the speed-up over the PyTorch engine that
returns the same outputs (`torch-eager` for engines returning attention,
`torch-eager-emb` for embeddings-only ones). Engines:

{engines}

{latency_tables}

![p50 latency vs sequence length, log-log]({plot_name})

p90/p99, sample counts, GFLOP/s and the share of the matmul peak of every
cell are in `{out}/latency.json` and `latency.csv`.

## End to end through gRPC

The server runs as its own process (as deployed); "runtime alone" is an
identical ORT session in the benchmark process, timed in alternating blocks
with the gRPC calls. One sequence per Encode, embeddings only (both use
`model_embeddings.onnx`), through the blocking `EncoderClient`.

{grpc_markdown(res.grpc)}
{_breakdown_picture(out)}
## Dynamic batching

Closed loop, {res.batching["concurrency"]} requests in flight, {res.batching["seq_len"]} tokens
each, embeddings only, {res.batching["duration_s"]:.0f} s per variant
(`attnserve bench load --mode closed --concurrency {res.batching["concurrency"]}` against a
server with default settings, then with `--max-batch-size 1`).

| server | req/s | p50 | p99 | server-side queue p50 |
|---|---|---|---|---|
| batching on | {on["achieved_rate"]:.0f} | {on["latency_ms"]["p50"]:.1f} ms | {on["latency_ms"]["p99"]:.1f} ms | {on["server_ms"]["queue"]["p50"]:.1f} ms |
| batching off | {off["achieved_rate"]:.0f} | {off["latency_ms"]["p50"]:.1f} ms | {off["latency_ms"]["p99"]:.1f} ms | {off["server_ms"]["queue"]["p50"]:.1f} ms |
{_saturation_section(res)}
{_hf_section(res)}{_containers_section(res)}## Comparisons computed from this run

{chr(10).join("- " + c for c in comparisons(res))}

{END_OF_GENERATED}
"""  # noqa: E501


def _hf_section(res: Results) -> str:
    if not res.hf:
        return ""
    m = res.hf["model"]
    ratios = [r["transformers-eager_p50_ms"] / r["ort-cpu_p50_ms"] for r in res.hf["rows"]]
    return f"""\
## A GPT-2 checkpoint: ONNX Runtime vs transformers

A distilgpt2-sized `GPT2Model` ({m["n_layer"]} layers, {m["n_head"]} heads, d_model
{m["n_embd"]}, vocabulary {m["vocab_size"]}, random weights) saved with
`save_pretrained`, imported and exported exactly as `attnserve export --from-hf`
does, batch 1. transformers with `attn_implementation="eager"` and
`output_attentions=True` against our graph with attentions; transformers'
default SDPA attention against our embeddings-only graph. ORT is
{min(ratios):.1f}x-{max(ratios):.1f}x faster with attentions.

{hf_markdown(res.hf)}

"""


def _containers_section(res: Results) -> str:
    if not res.containers:
        return ""
    c = res.containers
    header = "## Containers: the compose stack under load\n\n"
    if c.get("skipped"):
        return header + containers_markdown(c) + "\n"
    r = container_ratios(c)
    return f"""{header}\
`attnserve bench containers --out bench-results` (part of `make benchmarks`): the
compose stack's encoder ({c["engine"]}) against the same model file served by a host
process, then `--scale encoder=2` with gRPC `round_robin` over both published ports.
Every server runs ORT with {c["threads"]} thread; closed loops of {c["duration_s"]:g} s from
the host. One request at a time, the container's published port costs
{r["container_latency"]:.2f}x the host process's p50. Two replicas give
{r["scale_out"]:.2f}x the throughput of one at 16 in flight, on {res.env["cores"]} cores that the
load generator shares.

{containers_markdown(c)}
"""


def write_page(out: Path, doc: Path) -> None:
    """Rewrite `doc`'s generated part from the results in `out`; keep its hand-written part."""
    rows = [Row(**r) for r in json.loads((out / "latency.json").read_text())]
    env, grpc, batching = (
        json.loads((out / f"{name}.json").read_text())
        for name in ("environment", "grpc", "batching")
    )
    hf, containers = (
        json.loads(f.read_text()) if f.exists() else None
        for f in (out / "hf.json", out / "containers.json")
    )
    doc.parent.mkdir(parents=True, exist_ok=True)
    plot_name = "latency.png"
    shutil.copyfile(out / "latency.png", doc.parent / plot_name)
    if (out / BREAKDOWN_PLOT).exists():
        shutil.copyfile(out / BREAKDOWN_PLOT, doc.parent / BREAKDOWN_PLOT)
    generated = render(Results(rows, env, grpc, batching, hf, containers), out, plot_name)
    old = doc.read_text() if doc.exists() else ""
    by_hand = old.split(END_OF_GENERATED, 1)[1] if END_OF_GENERATED in old else ""
    doc.write_text(generated + ("\n" + by_hand.lstrip("\n") if by_hand else ""))
