"""`python -m bench report`: run every benchmark and regenerate docs/BENCHMARKS.md.

The tables, the plot and every number quoted in the prose come from this one
run; the prose around them says what they mean and, where a target is
missed, why, using the run's own numbers.
"""

from __future__ import annotations

import datetime
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from attnserve.bench.batching import run_batching
from attnserve.bench.containers import markdown as containers_markdown
from attnserve.bench.containers import ratios as container_ratios
from attnserve.bench.containers import run_containers
from attnserve.bench.engines import DESCRIPTIONS
from attnserve.bench.grpc_e2e import markdown as grpc_markdown
from attnserve.bench.grpc_e2e import run_grpc
from attnserve.bench.hf_compare import markdown as hf_markdown
from attnserve.bench.hf_compare import run_hf_compare
from attnserve.bench.latency import Row, markdown_table, run_latency
from attnserve.export.model_dir import write_model_dir
from attnserve.model.config import ModelConfig
from attnserve.model.encoder import build_encoder

COMMAND = (
    "make benchmarks   # = python -m bench report --out bench-results --doc docs/BENCHMARKS.md"
)


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
    ]


def _meaning(res: Results) -> str:
    eager, ort, floor = (res.p50(e, 128) for e in ("torch-eager", "ort-cpu", "matmul-only"))
    half = eager / 2 if eager else None
    longest = max(res.seq_lens())
    ort_row, floor_row = (res._index.get((e, 1, longest)) for e in ("ort-cpu", "matmul-only"))
    ort_pct = ort_row.pct_of_peak if ort_row else None
    floor_pct = floor_row.pct_of_peak if floor_row else None
    floor_gap = 100 * abs(ort_row.p50_ms / floor_row.p50_ms - 1) if ort_row and floor_row else None
    below = "below" if half and floor and half < floor else "near"
    lens = res.seq_lens()
    short = [t for t in lens if (res.ratio("torch-eager", "ort-cpu", t) or 0) >= 2]
    missed = [t for t in lens if t not in short]
    emb = {t: res.ratio("ort-cpu", "ort-cpu-emb", t) for t in lens if t >= 128}
    packed = next(r for r in res.grpc["attention"] if r["variant"] == "float16 causal-packed")
    full = next(r for r in res.grpc["attention"] if r["variant"] == "float32 full")
    overheads = [r["overhead_p50_ms"] for r in res.grpc["embeddings_overhead"]]
    server_side = [
        r["server_total_p50_ms"] - r["runtime_p50_ms"] for r in res.grpc["embeddings_overhead"]
    ]
    on, off = (res.batching["variants"][k] for k in ("batching on", "batching off"))
    return f"""\
- **ORT CPU is at least 2x faster than PyTorch eager at {", ".join(map(str, short)) or "no"}
  tokens** (batch 1). Short sequences are dominated by PyTorch's per-operator
  dispatch, which ORT avoids by running the whole graph in C++; long ones by
  eager's several full passes over the T x T scores (masking, softmax, stack).
- **Below 2x at {", ".join(map(str, missed)) or "no length"} tokens: the model is bound by its
  matrix products there, and so is every engine.** At 128 tokens the matmuls
  alone (`matmul-only`) take {_fmt(floor)} ms; ORT runs the whole model in
  {_fmt(ort)} ms and eager in {_fmt(eager)} ms, so 2x would need
  {_fmt(half)} ms, {below} the matmuls themselves. Small GEMMs (a 128 x 256 by 256 x 1024 product is
  67 MFLOP) reach only part of the 2048^2 peak. What would close it: fewer
  FLOPs (int8/fp16 weights with a kernel faster than fp32 on this CPU), more
  cores, or a GPU; not a better graph.
- **ORT reaches {_fmt(ort_pct, ".0f", "%")} of the 2048^2 matmul peak at 1024 tokens, not 70%,
  because the model's own matrix products cannot:** `matmul-only` runs at
  {_fmt(floor_pct, ".0f", "%")} of it at that length. The attention products are skinny
  (T x 32 by 32 x T per head, head_dim 32) and memory-bound, and the masked
  softmax over T x T scores adds traffic that does no FLOPs. ORT is within
  {_fmt(floor_gap, ".0f", "%")} of that floor.
- **The embeddings-only graph** (`ort-cpu-emb`, fused `Attention` op) against
  the graph that also returns attention (`ort-cpu`), speed-up:
  {", ".join(f"{_fmt(r, '.2f', 'x')} at {t}" for t, r in emb.items())}. It pays on long sequences,
  where the weights no longer have to be written out; the server uses it
  whenever no attention is asked for.
- **gRPC adds {min(overheads):.2f}-{max(overheads):.2f} ms** per call over the bare runtime, of
  which an empty RPC alone costs {res.grpc["empty_rpc_p50_ms"]:.2f} ms on this machine and
  {np.median(server_side):.2f} ms (median) is spent inside the server (asyncio, the hand-off to the
  ORT worker thread, building the response). The 0.35 ms target is below this
  transport's own floor here; a C++ client or a faster CPU would be needed.
- **Attention maps cost bytes, not model time.** At {full["seq_len"]} tokens, all layers
  and heads in float32 are {full["response_bytes"] / 1e6:.1f} MB and take
  {full["ratio_to_runtime"]:.1f}x the model's own time end to end; float16 causal-packed sends
  {full["response_bytes"] / packed["response_bytes"]:.1f}x fewer bytes and takes
  {packed["ratio_to_runtime"]:.1f}x. What remains is Python protobuf copying the bytes
  (serialise, parse) and the client widening float16 to float32: ask for the
  layers and heads you need.
- **Dynamic batching** at concurrency {res.batching["concurrency"]} and length
  {res.batching["seq_len"]}: {on["achieved_rate"]:.0f} req/s with batching,
  {off["achieved_rate"]:.0f} without ({_fmt(res.batching["speedup"], ".2f", "x")});
  p99 {on["latency_ms"]["p99"]:.0f} ms vs {off["latency_ms"]["p99"]:.0f} ms. Batches form from
  what queues while the model is busy, so a lone request never waits
  (`--max-batch-delay-ms` defaults to 0).
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

Generated by one command, which reruns everything below (about 15 minutes):

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

## Dynamic batching

Closed loop, {res.batching["concurrency"]} requests in flight, {res.batching["seq_len"]} tokens
each, embeddings only, {res.batching["duration_s"]:.0f} s per variant
(`python -m bench load --mode closed --concurrency {res.batching["concurrency"]}` against a
server with default settings, then with `--max-batch-size 1`).

| server | req/s | p50 | p99 | server-side queue p50 |
|---|---|---|---|---|
| batching on | {on["achieved_rate"]:.0f} | {on["latency_ms"]["p50"]:.1f} ms | {on["latency_ms"]["p99"]:.1f} ms | {on["server_ms"]["queue"]["p50"]:.1f} ms |
| batching off | {off["achieved_rate"]:.0f} | {off["latency_ms"]["p50"]:.1f} ms | {off["latency_ms"]["p99"]:.1f} ms | {off["server_ms"]["queue"]["p50"]:.1f} ms |

{_hf_section(res)}{_containers_section(res)}## What it means

{_meaning(res)}"""  # noqa: E501


def _hf_section(res: Results) -> str:
    if not res.hf:
        return ""
    m = res.hf["model"]
    ratios = [r["transformers-eager_p50_ms"] / r["ort-cpu_p50_ms"] for r in res.hf["rows"]]
    return f"""\
## A GPT-2 checkpoint: ONNX Runtime vs transformers

A distilgpt2-sized `GPT2Model` ({m["n_layer"]} layers, {m["n_head"]} heads, d_model
{m["n_embd"]}, vocabulary {m["vocab_size"]}, random weights) saved with
`save_pretrained`, imported and exported exactly as `python -m export --from-hf`
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
`python -m bench containers --out bench-results` (part of `make benchmarks`): the
compose stack's encoder ({c["engine"]}) against the same model file served by a host
process, then `--scale encoder=2` with gRPC `round_robin` over both published ports.
Every server runs ORT with {c["threads"]} thread; closed loops of {c["duration_s"]:g} s from
the host. One request at a time, the container's published port costs
{r["container_latency"]:.2f}x the host process's p50. Two replicas give
{r["scale_out"]:.2f}x the throughput of one at 16 in flight, on {res.env["cores"]} cores that the
load generator shares.

{containers_markdown(c)}
"""


def run_report(out: Path, doc: Path, quick: bool = False, render_only: bool = False) -> None:
    """Run every benchmark into `out` (unless render_only), then write `doc` from `out`."""
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if not render_only:
        run_latency(out, ModelConfig(), 128 if quick else None, [1, 8], quick)
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = Path(tmp)
            write_model_dir(build_encoder(ModelConfig()), model_dir, shapes=[(1, 1)], log=log)
            run_grpc(out, model_dir, 64 if quick else 512, quick)
            run_batching(out, model_dir, 2.0 if quick else 10.0, log)
        if not quick:  # exports an 82M-parameter model; builds images: too heavy for a smoke run
            run_hf_compare(out)
            run_containers(out, 10.0, log)
    rows = [Row(**r) for r in json.loads((out / "latency.json").read_text())]
    env, grpc, batching = (
        json.loads((out / f"{name}.json").read_text())
        for name in ("environment", "grpc", "batching")
    )
    doc.parent.mkdir(parents=True, exist_ok=True)
    plot_name = "latency.png"
    shutil.copyfile(out / "latency.png", doc.parent / plot_name)
    hf, containers = (
        json.loads(f.read_text()) if f.exists() else None
        for f in (out / "hf.json", out / "containers.json")
    )
    doc.write_text(render(Results(rows, env, grpc, batching, hf, containers), out, plot_name))
    log(f"wrote {doc}")
