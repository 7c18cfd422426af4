"""Renders docs/BENCHMARKS.md's generated part from one run's results (bench/suite.py runs it).

Everything generated is a table of measurements or a verdict or comparison
computed from them (bench/verdicts.py), so each sentence is true of that run by
construction. What the numbers mean (why a target is missed, what would close
it) is prose a person writes below the generated part, citing the run;
rendering keeps that part as it is.
"""

from __future__ import annotations

import datetime
import json
import shutil
from pathlib import Path

from attnserve.bench import before_after
from attnserve.bench.attention import BURST_LENGTH, BURST_REQUESTS
from attnserve.bench.attention import markdown as attention_markdown
from attnserve.bench.containers import markdown as containers_markdown
from attnserve.bench.containers import ratios as container_ratios
from attnserve.bench.engines import DESCRIPTIONS
from attnserve.bench.grpc_e2e import BREAKDOWN_PLOT
from attnserve.bench.grpc_e2e import markdown as grpc_markdown
from attnserve.bench.hf_compare import markdown as hf_markdown
from attnserve.bench.latency import Row, markdown_table
from attnserve.bench.profile import FLAMES
from attnserve.bench.profile import markdown as profile_markdown
from attnserve.bench.verdicts import Results, comparisons, targets

COMMAND = (
    "make benchmarks   # = attnserve bench report --out bench-results --doc docs/BENCHMARKS.md"
)
# The generated part of the page ends here; what follows the marker is written by hand.
END_OF_GENERATED = "<!-- end of the generated part: what follows is written by hand -->"


def _breakdown_picture(out: Path) -> str:
    if not (out / BREAKDOWN_PLOT).exists():
        return ""
    return f"""
![Where one Encode's time goes: the model, the server, the transport]({BREAKDOWN_PLOT})
"""


def before_after_section(out: Path) -> str:
    """The before/after table and picture, when the run has them (`bench before-after`)."""
    if not (out / "before_after.json").exists():
        return ""
    result = json.loads((out / "before_after.json").read_text())
    ref = result["ref"]
    which = "the last commit before issue 12's work, " if ref == before_after.ISSUE_12_BASE else ""
    return f"""
### Before and after: {ref[:7]} and this checkout

`attnserve bench before-after --out bench-results` (part of `make benchmarks`): the
server of {ref[:7]} ({which}its default model exported by its own code) against this
checkout's, Encode calls alternating in blocks with a bare echo of the same bytes. Each
server's own timing splits a call into inside the server (request received to answer
ready, the model's run included) and outside it (transport, gRPC call handling, client
decoding).

{before_after.markdown(result)}

![Where one Encode's time goes, {ref[:7]} and this checkout]({before_after.PLOT})
"""


def _profile_section(out: Path) -> str:
    if not (out / "profile.json").exists():
        return ""
    pictures = " and ".join(f"[{process}]({file})" for process, file in FLAMES.items())
    return f"""
### Inside the two processes

`attnserve bench profile --out bench-results` (part of `make benchmarks`): the server and
the blocking client, kernel CPU accounting per thread, then py-spy's flame graphs of the
same calls: {pictures}.

{profile_markdown(json.loads((out / "profile.json").read_text()))}
"""


def _peers_section(out: Path) -> str:
    """attnserve beside KServe (`bench peers`), when the run has it."""
    if not (out / "peers.md").exists():
        return ""
    return f"""
## Against the peers: KServe's model server

`attnserve bench peers --out bench-results` (part of `make benchmarks`): KServe's Python
model server (its own virtual environment, `.venv-peers`) serving the same graphs with the
same ORT session settings, each server through its own usual client, side by side in one
run. The saturated rows run the same draws; "previous policy" is this server with the
batching of the last release (`--max-batched-seq-len 100000 --max-padding 1e9
--instances 1`).

{(out / "peers.md").read_text().strip()}
"""


def _oip_section(out: Path) -> str:
    """The V2 protocol beside Encode (`bench oip`), when the run has it."""
    if not (out / "oip.md").exists():
        return ""
    return f"""
## The Open Inference Protocol (KServe V2)

`attnserve bench oip --out bench-results` (part of `make benchmarks`): one server, Encode
through attnserve's client and ModelInfer through tritonclient (its own environment,
`.venv-peers`), alternating blocks; then every attention weight of the longest length
through each path, against ONNX Runtime alone in the benchmark's process. Shared memory is
the protocol's system shared-memory extension: the server writes the output into the
client's registered region and the answer carries only its shape.

{(out / "oip.md").read_text().strip()}
{_perf_analyzer_part(out)}"""


def _perf_analyzer_part(out: Path) -> str:
    if not (out / "perf_analyzer.md").exists():
        return ""
    return f"""
`attnserve bench perf-analyzer --out bench-results`: Triton's own load generator against the
same V2 endpoint, concurrency 1 and 4 (its stability windows; latencies as it reports them).

{(out / "perf_analyzer.md").read_text().strip()}
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

Generated by one command, which reruns everything below (about 30 minutes on 2 cores):

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
{_breakdown_picture(out)}{before_after_section(out)}{_profile_section(out)}
## Dynamic batching

Closed loop, {res.batching["concurrency"]} requests in flight, {res.batching["seq_len"]} tokens
each, embeddings only, {res.batching["duration_s"]:.0f} s per variant
(`attnserve bench load --mode closed --concurrency {res.batching["concurrency"]}` against a
server with default settings, then with `--max-batch-size 1`).

| server | req/s | p50 | p99 | server-side queue p50 |
|---|---|---|---|---|
| batching on | {on["achieved_rate"]:.0f} | {on["latency_ms"]["p50"]:.1f} ms | {on["latency_ms"]["p99"]:.1f} ms | {on["server_ms"]["queue"]["p50"]:.1f} ms |
| batching off | {off["achieved_rate"]:.0f} | {off["latency_ms"]["p50"]:.1f} ms | {off["latency_ms"]["p99"]:.1f} ms | {off["server_ms"]["queue"]["p50"]:.1f} ms |
{_peers_section(out)}{_oip_section(out)}
{_attention_section(res)}{_hf_section(res)}{_containers_section(res)}## Comparisons computed from this run

{chr(10).join("- " + c for c in comparisons(res))}

{END_OF_GENERATED}
"""  # noqa: E501


def _attention_section(res: Results) -> str:
    if not res.attention:
        return ""
    return f"""## Attention options and the memory budget

`attnserve bench attention` (part of `make benchmarks`). First, each attention option
for one sequence of every layer's and head's weights, reduced as named, through gRPC
Encode and decoded by the client (token embeddings included), against the full graph
in-process, alternating. Then a burst: {BURST_REQUESTS} requests of {BURST_LENGTH} tokens
at once, each asking for every layer's and head's weights in float16 causal-packed form,
against a server process with default settings but for the flags named; RSS read from
/proc every 10 ms.

{attention_markdown(res.attention)}

"""


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
    hf, containers, attention = (
        json.loads(f.read_text()) if f.exists() else None
        for f in (out / "hf.json", out / "containers.json", out / "attention.json")
    )
    doc.parent.mkdir(parents=True, exist_ok=True)
    plot_name = "latency.png"
    shutil.copyfile(out / "latency.png", doc.parent / plot_name)
    for picture in (BREAKDOWN_PLOT, before_after.PLOT, *FLAMES.values()):
        if (out / picture).exists():
            shutil.copyfile(out / picture, doc.parent / picture)
    results = Results(rows, env, grpc, batching, hf, containers, attention)
    generated = render(results, out, plot_name)
    old = doc.read_text() if doc.exists() else ""
    by_hand = old.split(END_OF_GENERATED, 1)[1] if END_OF_GENERATED in old else ""
    doc.write_text(generated + ("\n" + by_hand.lstrip("\n") if by_hand else ""))
