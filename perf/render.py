"""Renders docs/BENCHMARKS.md's generated part from one run's results (suite.py runs it).

Every benchmark leaves NAME.json and NAME.md (its tables) in the results folder; the page
is those tables in the order a user deciding whether to deploy reads them, each with the
sentence that says what was measured and the command that measures it alone. What the
numbers mean is prose a person writes below the generated part, citing the run; rendering
keeps that part as it is.
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
from pathlib import Path

from attnserve.bench.engines import DESCRIPTIONS

COMMAND = "make benchmarks   # = python -m perf report --out bench-results"
# The generated part of the page ends here; what follows the marker is written by hand.
END_OF_GENERATED = "<!-- end of the generated part: what follows is written by hand -->"
PLOT = "latency.png"

# (results name, heading, what was measured, the command that measures it alone)
SECTIONS = [
    (
        "endpoints",
        "One request at a time, per length",
        "The same answer (one pooled vector) through each API of a server in its own process, "
        "against an identical ONNX Runtime session in the benchmark's process, alternating "
        "blocks.",
        "attnserve bench endpoints --out bench-results",
    ),
    (
        "peers",
        "Against KServe, MLServer and PyTriton",
        "KServe's Python model server, MLServer and PyTriton (each in its own environment, "
        "`.venv-peers`, `.venv-mlserver`, `.venv-pytriton`) serving the same graphs with the "
        "same session settings, the peers through tritonclient, attnserve through its own "
        "client; every server in turn within each block. Each row also against its floor, a "
        "server with no code of its own: ONNX Runtime's run of the same graph in the "
        "benchmark's process plus a bare gRPC echo of attnserve's answer's bytes (for the "
        "embeddings, one run and one echo in turn, as a server meets them). Every "
        "client's process and the echo server keep their freed heap "
        "(attnserve.client.keep_freed_heap). The saturated rows run the same draws.",
        "python -m perf peers",
    ),
    (
        "batching",
        "Dynamic batching",
        "Closed loop, 64 requests of 16 tokens in flight, one server with batching on, then "
        "with `--max-batch-size 1`.",
        "attnserve bench load --mode closed --concurrency 64 --lengths 16 --target HOST:PORT",
    ),
    (
        "oip",
        "The Open Inference Protocol (KServe V2) and shared memory",
        "One server: Encode through attnserve's client, ModelInfer through tritonclient; then "
        "every attention weight of the longest length through each path, against ONNX "
        "Runtime alone. Shared memory: the server writes into the client's region.",
        "python -m perf oip",
    ),
    (
        "perf_analyzer",
        "Triton's perf_analyzer",
        "Triton's own load generator against the V2 endpoint (its stability windows; its "
        "latencies).",
        "python -m perf perf-analyzer",
    ),
    (
        "attention",
        "Attention options and the memory budget",
        "Each attention option for one sequence (every layer and head, reduced as named) "
        "through Encode, against the full graph in process; then a burst of requests asking "
        "for every weight, against servers with and without the budget (RSS every 10 ms).",
        "attnserve bench attention --out bench-results --model models/default",
    ),
    (
        "latency",
        "The runtime against PyTorch",
        "The model alone, every engine on the same weights and inputs; in parentheses the "
        "speed-up over the PyTorch engine with the same outputs. Plot: "
        f"![p50 latency vs sequence length]({PLOT})",
        "attnserve bench latency --out bench-results",
    ),
    (
        "families",
        "The families people study",
        "Random weights in real models' shapes, imported by `attnserve export --from-hf`: ONNX "
        "Runtime on CPU (the graphs the server runs) against transformers' eager implementation "
        "with `output_attentions` on and off, batch 1, alternating blocks, and the server end "
        "to end through Encode; then what importing a 0.5B-parameter model costs (the export "
        "process's wall time and peak RSS).",
        "python -m perf families",
    ),
    (
        "families_second_round",
        "The families people study: the second round at real sizes",
        "Random bfloat16 checkpoints in the shapes of gemma-2-2b, Llama-3.2-1B, Qwen3-0.6B and "
        "gemma-3-1b, each imported in float32 by `attnserve export --from-hf` (the process "
        "tree's peak RSS sampled every half second), served by `attnserve serve`, then ONNX "
        "Runtime (the graphs the server runs) and transformers' eager implementation, with "
        "attention weights and without, one after the other: two float32 copies of a 2.6B "
        "model do not fit beside each other in this machine's memory.",
        "python -m perf families --second-round",
    ),
    (
        "sizes",
        "Real sizes",
        "Random bfloat16 checkpoints in the shapes of Qwen2.5-0.5B, TinyLlama-1.1B, Pythia-1.4B, "
        "Mistral-7B, Llama-3.1-8B and gemma-2-9b, each step in a child process whose process "
        "tree's summed RSS is "
        "sampled every half second: transformers loads it in float32, saves it and runs a "
        "128-token forward with attention, then times forwards with attention; `attnserve "
        "export --from-hf` imports it (float32 or int8); `attnserve serve` serves it (RSS after "
        "warm-up, after one layer's attention at 128 tokens and after every layer's hidden "
        "states and the predictions at 128 (since 2026-11-28); Encode's p50 with one layer's "
        "attention). Ratios are against the float32 weights. The 7-9B shapes do not fit in "
        "float32 here: int8 only, without transformers.",
        "python -m perf sizes",
    ),
    (
        "readouts",
        "Beyond attention: what the readouts cost",
        "Random weights in SmolLM2-135M's shape (30 layers, d 576, a 49,152-token vocabulary) "
        "imported and served; one Encode at a time, the kinds of request in alternating "
        "blocks, then a plain request against the server before the readouts reached the "
        "transports on the same model directory.",
        "python -m perf readouts",
    ),
    (
        "features",
        "Features: what sparse autoencoders cost",
        "gemma-2-2b's shape (random, float32) with JumpReLU SAEs of 4k-32k features on layer "
        "12 and a 16k SAE on every layer; Encode at T = 128 in alternating blocks; then a "
        "plain request against the server before features, SmolLM2-135M's shape with an SAE "
        "beside it, three runs.",
        "python -m perf features",
    ),
    (
        "features-llama-8b",
        "Features beside an 8B model in int8",
        "Llama-3.1-8B's shape (random bfloat16) imported in int8 (float32 arithmetic) with a "
        "32k Llama Scope-shaped SAE in int8 on layer 15's residual stream, served together.",
        "python -m perf features --llama-8b",
    ),
    (
        "interventions",
        "Interventions: activation patching in one call",
        "GPT-2 small's shape (random, float32) imported and served; TransformerLens 3.x's "
        "HookedTransformer of the same weights in the benchmark's process on the same CPU. "
        "An IOI-style 20-token pair: the resid_pre and per-head patching grids, attnserve's "
        "one Encode against TransformerLens' patching functions in alternating blocks; then a "
        "plain request against the server before interventions, three runs.",
        "python -m perf interventions",
    ),
    (
        "generate",
        "Generation: a KV cache, texts batched together",
        "TinyLlama-1.1B's shape (random, float32) imported in float32 and int8 and served, one "
        "precision at a time; onnxruntime-genai's model of the same checkpoint made by its own "
        "builder (`.venv-genai`); transformers' `generate` in the benchmark's process. A "
        "32-token prompt, 64 greedy tokens, medians of three runs; attnserve also with 8 "
        "streaming requests at once; then a plain Encode against the server before generation.",
        "python -m perf generate",
    ),
    (
        "together",
        "Encodes and generation on one server",
        "SmolLM2-135M's shape (random, float32) imported by each build and served over gRPC, "
        "this checkout's engine against ed4f6bb's two schedulers (the Batcher and the "
        "Generator), the two servers in turn within each of three rounds (medians): Encodes "
        "alone at T = 8, 128 and 512; one text's decode speed; 8 texts of 128 tokens at once; "
        "an Encode at T = 128 sent while 8 texts generate (one at a time, 0.5 s apart); 8 texts "
        "while Encodes at T = 128 "
        "keep arriving one after another.",
        "python -m perf together",
    ),
    (
        "long",
        "Long texts: attention statistics by query blocks",
        "Llama-3.2-1B's shape (random, float32) imported with `--max-seq-len 8192` and served; "
        "at each length one request for the embeddings alone and one for every layer's and "
        "head's top-8 keys per row, received attention and row entropy, each kind on a server "
        "of its own; transformers' eager attention in a process of its own where it fits.",
        "python -m perf long",
    ),
    (
        "repository",
        "Several models, and reloads",
        "A server of a repository (`--model-repository`) with the default model alone, and one "
        "with a second copy loaded beside it, side by side in alternating blocks; then one "
        "server under a closed loop, without and during a reload to version 2 "
        "(RepositoryModelLoad).",
        "python -m perf repository",
    ),
    (
        "ray",
        "On Ray Serve",
        "One replica of the Ray Serve application behind Ray's HTTP and gRPC proxies, against "
        "`attnserve serve` with the same settings, one request at a time in alternating blocks; "
        "then a closed loop on one replica and on two, on this one machine.",
        "python -m perf ray",
    ),
    (
        "containers",
        "Containers",
        "The compose stack's encoder against the same model served by a host process, then "
        "two replicas with gRPC round robin; closed loops from the host.",
        "python -m perf containers",
    ),
]


def render(out: Path) -> str:
    env = json.loads((out / "environment.json").read_text())
    parts = [
        "# Benchmarks\n",
        "What to expect from attnserve on one machine, against what a user would run instead: "
        "ONNX Runtime in their own process, PyTorch, KServe's model server. One command reruns "
        f"everything (about 30 minutes on 2 cores) and rewrites this page:\n\n    {COMMAND}\n",
        "Raw results (JSON) land in `bench-results/`. The machines are shared and noisy: read "
        "the ratios, measured side by side in one run.\n",
        "| machine | |\n|---|---|",
        f"| CPU | {env['cpu']}, {env['cores']} cores |",
        f"| software | Python {env['python']}, torch {env['torch']}, onnxruntime "
        f"{env['onnxruntime']} |",
        "| model | the default model (4 layers, 8 heads, d_model 256), CPU execution provider |",
        f"| run | {datetime.date.today().isoformat()}, commit {_commit()} |\n",
    ]
    for name, heading, what, command in SECTIONS:
        table = out / f"{name}.md"
        if name == "batching":
            body = _batching_table(out) if (out / "batching.json").exists() else None
        else:
            body = table.read_text().strip() if table.exists() else None
        if body is None:
            continue
        if name == "latency":  # batch 1 here; every batch size is in latency.md and the plot
            body = body.split("### batch")[1].strip().replace("1\n", "Batch 1:\n", 1)
            body += "\n\n" + _engines(env)
        parts.append(f"## {heading}\n\n{what} `{command}`\n\n{body}\n")
    parts.append(END_OF_GENERATED + "\n")
    return "\n".join(parts)


def _batching_table(out: Path) -> str:
    result = json.loads((out / "batching.json").read_text())
    lines = ["| server | req/s | p50 | p99 |", "|---|---|---|---|"]
    for name, v in result["variants"].items():
        p = v["latency_ms"]
        lines.append(
            f"| {name} | {v['achieved_rate']:.0f} | {p['p50']:.1f} ms | {p['p99']:.1f} ms |"
        )
    return "\n".join(lines) + f"\n\nBatching on / off: {result['speedup']:.2f}x requests/s."


def _engines(env: dict) -> str:
    unavailable = env.get("unavailable_engines", {})
    return "\n".join(
        f"- `{name}`: {text}"
        + (f" (not run here: {unavailable[name]})" if name in unavailable else "")
        for name, text in DESCRIPTIONS.items()
    )


def _commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return done.stdout.strip() or "unknown"


def write_page(out: Path, doc: Path) -> None:
    """Rewrite `doc`'s generated part from the results in `out`; keep its hand-written part."""
    doc.parent.mkdir(parents=True, exist_ok=True)
    if (out / PLOT).exists():
        shutil.copyfile(out / PLOT, doc.parent / PLOT)
    old = doc.read_text() if doc.exists() else ""
    by_hand = old.split(END_OF_GENERATED, 1)[1] if END_OF_GENERATED in old else ""
    doc.write_text(render(out) + ("\n" + by_hand.lstrip("\n") if by_hand else ""))
