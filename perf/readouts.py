"""`python -m perf readouts`: what the readouts cost, on SmolLM2-135M's shape.

Random weights in SmolLM2-135M's shape (Llama: 30 layers, d 576, 9 query / 3 KV heads, a
49,152-token vocabulary), imported by `attnserve export --from-hf` and served by `attnserve
serve`. Encode at T = 8 and 128, in alternating blocks: the embeddings alone (a plain
request); the logit lens of the last position over every state (31 rows, top 5); the
next-token predictions there; every state's hidden state there; the embeddings with one
head removed; direct logit attribution of one token there; every attention weight (for
scale). Issue 52's target: the lens at T = 128
within 1.2x the embeddings alone.

Then a plain request before and after: the same model directory served by `--ref`'s code
(the commit before the readouts reached the transports), alternating with this checkout's:
p50 of the embeddings at T = 8 and 128 (target: within 2%). And the server's resident
memory before and after the readouts' sessions opened.
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from attnserve.bench.results import save
from attnserve.bench.timing import p50_ms, repeated
from attnserve.client import ClientOptions, EncoderClient
from attnserve.service.process import spawn_server
from perf.hf_checkpoints import SMOLLM2_135M, build_checkpoint
from perf.sizes import tree_rss
from perf.sources import environment, sources_of

LENGTHS = (8, 128)
BEFORE_READOUTS = "7f71806"  # the last commit before the readouts reached the transports
LENS_TARGET = 1.2
PLAIN_TARGET = 1.02
MAX_SEQ_LEN = 512
GiB = 2**30


def requests(n_layers: int) -> dict[str, dict]:
    """Each kind of request, as EncoderClient.encode's options."""
    last = {"positions": [-1]}
    return {
        "embeddings": {},
        "lens, last position, every state": {"logit_lens": {**last, "top_k": 5}},
        "predictions, last position": {"predictions": last},
        "hidden states, last position": {"hidden_states": last},
        "one head removed": {"head_mask": {(n_layers // 2, 0): 0.0}},
        "attribution, last position, one target": {"attribution": {**last, "target_ids": [42]}},
        "every attention weight": {"attention": True},
    }


def run_readouts(out: Path, ref: str = BEFORE_READOUTS, repeats: int = 20, log=print) -> dict:
    result: dict = {"ref": ref, "rows": [], "plain": []}
    out.mkdir(parents=True, exist_ok=True)  # its scratch goes beside `out`
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=out.parent))).resolve()
        log("SmolLM2-135M's shape: building a random checkpoint and importing it...")
        build_checkpoint("llama", work / "hf", perturb=0.0, **SMOLLM2_135M)
        model_dir = work / "model"
        command = [sys.executable, "-m", "attnserve", "export", "--from-hf", str(work / "hf")]
        command += ["--out", str(model_dir), "--max-seq-len", str(MAX_SEQ_LEN)]
        subprocess.run(command, check=True, capture_output=True)
        server = spawn_server(model_dir, "--provider", "cpu")
        stack.callback(server.process.wait, 60)
        stack.callback(server.process.terminate)
        client = stack.enter_context(EncoderClient(server.address, ClientOptions(timeout_s=300)))
        info = client.model_info()
        result["rss_before_readouts_gib"] = round(tree_rss(server.process.pid) / GiB, 2)
        rng = np.random.default_rng(0)
        for t in LENGTHS:
            ids = rng.integers(0, info["vocab_size"], size=t).tolist()
            calls: dict[str, Callable[[], object]] = {
                name: functools.partial(client.encode, [ids], **options)
                for name, options in requests(info["n_layers"]).items()
            }
            log(f"  T = {t}: {', '.join(calls)}")
            times = repeated(calls, repeats)
            row = {"seq_len": t, "p50_ms": {n: round(p50_ms(s), 3) for n, s in times.items()}}
            result["rows"].append(row)
        result["rss_after_readouts_gib"] = round(tree_rss(server.process.pid) / GiB, 2)

        log(f"  a plain request: {ref}'s server beside this checkout's, on one model directory")
        result["plain"] = plain_against(
            stack, model_dir, ref, client, info["vocab_size"], repeats * 3, runs=1
        )
    save(out, "readouts", result, table(result))
    return result


def plain_against(
    stack: contextlib.ExitStack,
    model_dir: Path,
    ref: str,
    client: EncoderClient,
    vocab_size: int,
    repeats: int,
    runs: int,
) -> list[dict]:
    """A plain request's p50 (ms) at each of LENGTHS on `ref`'s server of `model_dir` and on
    this checkout's (`client`), alternating in blocks, `runs` separate times per length."""
    src = stack.enter_context(sources_of(ref))
    before = spawn_server(model_dir, "--provider", "cpu", cwd=src, env=environment(src))
    stack.callback(before.process.wait, 60)
    stack.callback(before.process.terminate)
    old = stack.enter_context(EncoderClient(before.address, ClientOptions(timeout_s=300)))
    rng = np.random.default_rng(1)
    rows = []
    for t in LENGTHS:
        ids = rng.integers(0, vocab_size, size=t).tolist()
        calls = {"before": functools.partial(old.encode, [ids])}
        calls["after"] = functools.partial(client.encode, [ids])
        for run in range(runs):  # separate runs: their spread is the machine's noise
            times = repeated(calls, repeats)
            row = {"seq_len": t} | ({"run": run} if runs > 1 else {})
            rows.append(row | {n: round(p50_ms(s), 3) for n, s in times.items()})
    return rows


def table(result: dict) -> str:
    names = list(result["rows"][0]["p50_ms"])
    lines = [
        "| request (Encode, one sequence) | "
        + " | ".join(f"p50 at T = {r['seq_len']}" for r in result["rows"])
        + " |",
        "|---|" + "---|" * len(result["rows"]),
    ]
    for name in names:
        cells = []
        for row in result["rows"]:
            p50 = row["p50_ms"][name]
            cells.append(f"{p50:.2f} ms ({p50 / row['p50_ms']['embeddings']:.2f}x)")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lens = result["rows"][-1]["p50_ms"]
    ratio = lens["lens, last position, every state"] / lens["embeddings"]
    verdict = "met" if ratio <= LENS_TARGET else "missed"
    lines += [
        "",
        f"The lens at T = {result['rows'][-1]['seq_len']}: {ratio:.2f}x the embeddings alone "
        f"(target <= {LENS_TARGET}x: {verdict}). Server RSS "
        f"{result['rss_before_readouts_gib']} GiB before the readouts, "
        f"{result['rss_after_readouts_gib']} GiB after.",
        "",
        f"| a plain request (embeddings) | {result['ref']}'s server | this checkout's | ratio |",
        "|---|---|---|---|",
    ]
    return "\n".join(lines + plain_rows(result["plain"]))


def plain_rows(plain: list[dict]) -> list[str]:
    """A plain request's p50 before and after, a table row per length (and run)."""
    rows = []
    for row in plain:
        ratio = row["after"] / row["before"]
        run = f", run {row['run']}" if "run" in row else ""
        rows.append(
            f"| T = {row['seq_len']}{run} | {row['before']:.2f} ms | {row['after']:.2f} ms | "
            f"{ratio:.3f}x ({'within' if ratio <= PLAIN_TARGET else 'outside'} 2%) |"
        )
    return rows
