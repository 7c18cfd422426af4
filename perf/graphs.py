"""`python -m perf graphs`: attribution graphs, attnserve against circuit-tracer 0.5.0 on
the same CPU in the same run (--case llama-8), and gemma-2-2b's shape (--case gemma-2-2b).

A random checkpoint with an outlier dimension and a JumpReLU transcoder per layer of
trained scale (perf/circuit_tracer_peer.py builds both with circuit-tracer's own
transformers), imported by `attnserve export --from-hf` and `attnserve sae add`, served by
`attnserve serve`. The same token ids, circuit-tracer's command-line knobs (batch_size 256,
a max_feature_nodes), in alternating rounds: circuit-tracer's attribute() in its own
process (its model loaded first, not timed) against attnserve's Graph call through the
client, which includes pruning and the graph file. Then how far apart the two graphs are,
and each process's peak resident memory beside the weights. Issue 85's targets: at least
3x circuit-tracer's speed on llama-8 (the largest shape both hold in this machine's RAM at
once); gemma-2-2b's shape (26 layers of 16k transcoders, ~18 GB of float32 weights, too
big for both) in at most 10 minutes and its weights + 3 GiB of RSS, attnserve alone.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnserve.bench.results import save
from attnserve.client import ClientOptions, EncoderClient
from attnserve.export.transcoder_set import add_transcoder_set
from attnserve.service.process import spawn_server
from perf.features import memory_status
from perf.hf_checkpoints import GEMMA2_2B
from perf.peer_env import CIRCUIT_TRACER, peer_venv


@dataclass(frozen=True)
class Case:
    """A checkpoint shape and its transcoders, and whether circuit-tracer runs beside."""

    family: str
    shape: dict
    width: int  # features per transcoder
    active: float  # about this share of them on at a position
    input_hook: str
    knobs: dict
    peer: bool
    tolerance: float  # the import's fidelity gate


CASES = {
    # the largest both fit in RAM at once, with skip transcoders
    "llama-8": Case(
        "llama",
        dict(
            hidden_size=512,
            intermediate_size=2048,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=4,
            max_position_embeddings=256,
        ),
        4096,
        0.02,
        "hook_resid_mid",
        {"batch_size": 256, "max_feature_nodes": 2048},
        True,
        1e-4,
    ),
    # gemma-2-2b's shape with Gemma Scope's transcoders' (16k JumpReLU features reading the
    # MLP's standardized input, about 65 on at a position, no skip) and circuit-tracer's
    # command line's knobs: ~18 GB of float32 weights, attnserve alone
    "gemma-2-2b": Case(
        "gemma2",
        GEMMA2_2B,
        16384,
        # 0.004 turned on 3,346 features in all, fewer than max_feature_nodes
        0.01,
        "ln2.hook_normalized",
        {"batch_size": 256, "max_feature_nodes": 7500},
        False,
        # 26 layers on an outlier dimension in the thousands: the attention weights at
        # T = 17 came 1.0e-4 from PyTorch's, at the default gate
        1e-3,
    ),
}
T = 16
TARGET = 3.0  # issue 85: at least 3x circuit-tracer's speed
BUDGET_GIB = 3.0  # issue 85: RSS at most the model and transcoders and this
GRAPH_SECONDS = 600.0  # issue 85: gemma-2-2b's shape in at most 10 minutes
GiB = 2**30


def run_graphs(out: Path, rounds: int = 2, case_name: str = "llama-8", log=print) -> dict:
    case = CASES[case_name]
    python = peer_venv(Path.cwd() / CIRCUIT_TRACER.venv, log, CIRCUIT_TRACER.pins, False)
    ids = [1, *np.random.default_rng(0).integers(3, 380, size=T - 1).tolist()]
    knobs = case.knobs
    result: dict = {
        "case": case_name,
        "shape": {"family": case.family, **case.shape},
        "width": case.width,
        "input_hook": case.input_hook,
        "seq_len": T,
        "knobs": knobs,
    }
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=out.parent))).resolve()
        log(f"building a {case.shape['num_hidden_layers']}-layer checkpoint and its transcoders...")
        build = [
            str(python),
            str(CIRCUIT_TRACER.script),
            "build",
            "--family",
            case.family,
            "--out",
            str(work),
            "--shape",
            json.dumps(case.shape),
            "--width",
            str(case.width),
            "--active",
            str(case.active),
            "--input-hook",
            case.input_hook,
        ]
        subprocess.run(build + ([] if case.peer else ["--no-skip"]), check=True)  # fmt: skip
        model_dir = work / "attnserve"
        log("importing it (attnserve export --from-hf) and its transcoders (sae add)...")
        command = ["attnserve", "export", "--from-hf", str(work / "model"), "--out"]
        # 64 tokens: the graph's prompt and more (the gate's 256-token case sits at 1.6e-4
        # of its scale with this outlier dimension, past the default 1e-4)
        command += [str(model_dir), "--max-seq-len", "64", "--tolerance", str(case.tolerance)]
        exported = subprocess.run(command, capture_output=True, text=True)
        if exported.returncode:
            raise RuntimeError(f"the export failed:\n{exported.stderr[-2000:]}")
        add_transcoder_set(model_dir, work / "transcoders", name="plt", log=log)
        result["weights_gib"] = {
            "model": round((model_dir / "weights.data").stat().st_size / GiB, 3),
            "transcoders": round(
                sum(f.stat().st_size for f in (work / "transcoders").glob("*.safetensors")) / GiB,
                3,
            ),
        }
        server = spawn_server(model_dir, "--provider", "cpu", timeout=900)
        stack.callback(server.process.wait, 120)
        stack.callback(server.process.terminate)
        client = stack.enter_context(EncoderClient(server.address, ClientOptions(timeout_s=3600)))
        seconds: dict[str, list[float]] = {"attnserve": [], "circuit_tracer": []}
        for round_ in range(rounds):
            engines = "circuit-tracer, then attnserve" if case.peer else "attnserve"
            log(f"  round {round_ + 1}: {engines}")
            if case.peer:
                theirs = _circuit_tracer(python, work, ids, work / f"ct{round_}.npz", knobs)
                seconds["circuit_tracer"].append(float(theirs["seconds"]))
            start = time.perf_counter()
            graph = client.graph(ids, "plt", progress=_every_tenth(log), **knobs)
            seconds["attnserve"].append(time.perf_counter() - start)
        median = {name: round(statistics.median(s), 2) for name, s in seconds.items() if s}
        result |= {
            "seconds": seconds,
            "median_s": median,
            "nodes_kept": len(graph["nodes"]),
        }
        status = memory_status(server.process.pid)
        result["peak_rss_gib"] = {"attnserve": round(status["VmHWM"] / GiB, 2)}
        # after the graphs: what stays resident, its own pages and the files' it maps
        result["rss_after_gib"] = {
            name: round(status[name] / GiB, 2) for name in ("VmRSS", "RssAnon", "RssFile")
        }
        if case.peer:
            # the unpruned graph to compare (not timed: 4.8M numbers of JSON both ways)
            ours = client.graph(ids, "plt", include_adjacency=True, **knobs)
            mine = np.array(ours["adjacency"]["adjacency_matrix"], np.float32)
            want = theirs["adjacency_matrix"]
            largest = np.maximum(np.abs(want).max(axis=1, keepdims=True), 1e-30)
            result |= {
                "speedup": round(median["circuit_tracer"] / median["attnserve"], 2),
                "active_features": len(theirs["active_features"]),
                "nodes": int(want.shape[0]),
                "adjacency_gap": float((np.abs(mine - want) / largest).max()),
                "same_selected": bool(
                    ours["adjacency"]["selected_features"] == theirs["selected_features"].tolist()
                ),
            }
            result["peak_rss_gib"]["circuit_tracer"] = round(float(theirs["peak_rss"]) / GiB, 2)
    save(out, f"graphs-{case_name}", result, table(result))
    return result


def _circuit_tracer(python: Path, folder: Path, ids: list[int], out: Path, knobs: dict):
    subprocess.run(
        [str(python), str(CIRCUIT_TRACER.script), "attribute", str(folder),
         "--ids", ",".join(map(str, ids)), "--out", str(out), "--knobs", json.dumps(knobs)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return np.load(out)


def _every_tenth(log):
    """A progress callback that logs rows done each tenth of the way."""
    shown = [-1]

    def progress(rows: int, total: int) -> None:
        if 10 * rows // total > shown[0]:
            shown[0] = 10 * rows // total
            log(f"    {rows} / {total} rows")

    return progress


def table(result: dict) -> str:
    shape, median, peak = result["shape"], result["median_s"], result["peak_rss_gib"]
    weights, after = result["weights_gib"], result["rss_after_gib"]
    beside = peak["attnserve"] - weights["model"] - weights["transcoders"]
    knobs = result["knobs"]
    lines = [
        f"Attribution graphs: {result['case']}, a {shape['family']}-shaped checkpoint "
        f"({shape['num_hidden_layers']} layers, d {shape['hidden_size']}, random, float32, "
        f"an outlier dimension) with {result['width']}-feature JumpReLU transcoders reading "
        f"{result['input_hook']}, T = {result['seq_len']}, batch_size {knobs['batch_size']}, "
        f"max_feature_nodes {knobs['max_feature_nodes']}; medians",
        "",
        "| engine | graph | peak RSS |",
        "|---|---|---|",
    ]
    if "speedup" in result:
        lines.append(
            f"| circuit-tracer 0.5.0 (attribute(), its model loaded) | "
            f"{median['circuit_tracer']:.2f} s | {peak['circuit_tracer']} GiB |"
        )
    lines += [
        f"| attnserve (the Graph call: with pruning and the file) | "
        f"{median['attnserve']:.2f} s | {peak['attnserve']} GiB |",
        "",
        f"Weights: the model {weights['model']} GiB, the transcoders {weights['transcoders']} "
        f"GiB; attnserve's peak is {beside:+.2f} GiB beside them (budget "
        f"+{BUDGET_GIB:.0f} GiB: {'met' if beside <= BUDGET_GIB else 'NOT met'}). "
        f"{result['nodes_kept']} nodes kept. After the graphs the server holds "
        f"{after['VmRSS']} GiB: {after['RssAnon']} of its own, {after['RssFile']} of mapped "
        "files (a page mapped twice counts twice).",
    ]
    if "speedup" in result:
        met = "met" if result["speedup"] >= TARGET else "NOT met"
        lines.append(
            f"{result['speedup']:.2f}x circuit-tracer's speed (target {TARGET:.0f}x: {met}), "
            f"{result['active_features']} features active, {result['nodes']} nodes. The same "
            f"features visited: {result['same_selected']}; the adjacency within "
            f"{result['adjacency_gap']:.1e} of each row's largest."
        )
    else:
        met = "met" if median["attnserve"] <= GRAPH_SECONDS else "NOT met"
        lines.append(f"Target: the graph in at most {GRAPH_SECONDS / 60:.0f} minutes: {met}.")
    return "\n".join(lines)
