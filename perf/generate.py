"""`python -m perf generate`: text generation on TinyLlama-1.1B's shape against the engines a
user would reach for instead, in one run on this CPU.

A random float32 checkpoint of TinyLlama-1.1B's shape (22 layers, d 2048, 32 query and 4
key/value heads, 32,000 tokens) built by transformers; imported by `attnserve export
--from-hf` in float32 and int8 and served by `attnserve serve` (each precision a server of
its own, one at a time); onnxruntime-genai's model of the same checkpoint made by its own
builder (in .venv-genai, float32, CPU); transformers' `generate` in this process. The same
32-token prompt, 64 greedy tokens: the time to the first token and the decode speed
after it (tokens 2..64 over their time), the median of `repeats` runs each; attnserve also
with 8 requests at once over OpenAI's streaming completions (aggregate tokens per second);
whether the greedy tokens agree; each server's resident and peak memory. Issue 71's
targets: float32 decode >= 0.9x onnxruntime-genai's tokens/s, int8 >= 2x attnserve's
float32, 8 requests >= 3x one request's aggregate, time to first token <= genai's. Then a
plain Encode before and after generation existed (`--ref`), alternating (target: 2%).
"""

from __future__ import annotations

import contextlib
import gc
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import httpx
import numpy as np
import torch

from attnserve.bench.results import save
from attnserve.client import ClientOptions, EncoderClient
from attnserve.service.process import spawn_server
from perf.features import peak_rss
from perf.hf_checkpoints import TINYLLAMA_11B, build_checkpoint
from perf.peer_env import peer_venv
from perf.readouts import plain_against, plain_rows
from perf.sizes import tree_rss

BEFORE_GENERATION = "e2a94b1"  # the last commit before generation
# --quick: a two-layer model of the same kind, to check the benchmark itself
QUICK = dict(TINYLLAMA_11B, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)  # fmt: skip
PROMPT_TOKENS, NEW_TOKENS, CONCURRENT = 32, 64, 8
GENAI_VENV = Path(".venv-genai")
DRIVER = Path(__file__).with_name("genai_driver.py")
GiB = 2**30


def genai_python(log) -> Path:
    """onnxruntime-genai (with the CPU onnxruntime it needs: it would shadow this
    environment's onnxruntime-gpu) and its builder's torch, transformers and onnx-ir at this
    environment's versions, in an environment of its own; made once."""
    pins = (
        "onnxruntime-genai==0.18.0",
        f"onnx-ir=={metadata.version('onnx-ir')}",
        f"torch=={torch.__version__.split('+')[0]}",
        f"transformers=={metadata.version('transformers')}",
    )
    return peer_venv(GENAI_VENV, log, pins, same_runtime=False)


def summary(runs: list[dict]) -> dict:
    """Median time to the first token (ms) and decode speed (tokens 2.. per second)."""
    first = statistics.median(r["first_s"] for r in runs)
    decode = statistics.median((r["tokens"] - 1) / (r["total_s"] - r["first_s"]) for r in runs)
    return {"first_token_ms": round(first * 1000, 1), "decode_tokens_per_s": round(decode, 2)}


def transformers_runs(model, prompt: list[int], repeats: int) -> tuple[list[dict], list[int]]:
    """transformers' greedy generate: the first token's time (a run of one new token) and
    the whole run's, alternately."""
    ids = torch.tensor([prompt])
    runs, tokens = [], []
    with torch.no_grad():
        for _ in range(repeats + 1):  # the first run warms up
            start = time.perf_counter()
            model.generate(ids, max_new_tokens=1, do_sample=False)
            first = time.perf_counter() - start
            start = time.perf_counter()
            out = model.generate(
                ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
            )
            total = time.perf_counter() - start
            tokens = out[0, len(prompt) :].tolist()
            runs.append({"first_s": first, "total_s": total, "tokens": len(tokens)})
    return runs[1:], tokens


def streamed(url: str, prompt: list[int]) -> tuple[dict, list[int]]:
    """One streaming completion's timing, from the request to its first and last chunk."""
    body = {
        "prompt": prompt,
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    tokens: list[int] = []
    start = time.perf_counter()
    first = 0.0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=900) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            tokens += json.loads(line[6:])["choices"][0]["token_ids"]
            first = first or time.perf_counter() - start
    return {"first_s": first, "total_s": time.perf_counter() - start, "tokens": len(tokens)}, tokens


def attnserve_runs(
    model_dir: Path, precision: str, prompt: list[int], vocab: int, repeats: int, log
) -> dict:
    """One server of `precision`: batch 1 `repeats` times, then CONCURRENT at once."""
    server = spawn_server(model_dir, "--provider", "cpu", "--precision", precision, timeout=900)
    try:
        url = f"http://127.0.0.1:{server.http_port}"
        runs, tokens = [], []
        for _ in range(repeats + 1):  # the first run warms up (opens the decode graph)
            run, tokens = streamed(url, prompt)
            runs.append(run)
        log(f"  attnserve {precision}: {summary(runs[1:])}; {CONCURRENT} requests at once...")
        rng = np.random.default_rng(3)
        prompts = [rng.integers(0, vocab, PROMPT_TOKENS).tolist() for _ in range(CONCURRENT)]
        start = time.perf_counter()
        with ThreadPoolExecutor(CONCURRENT) as pool:
            together = list(pool.map(lambda p: streamed(url, p)[0], prompts))
        wall = time.perf_counter() - start
        return {
            **summary(runs[1:]),
            "token_ids": tokens,
            "concurrent": {
                "requests": CONCURRENT,
                "wall_s": round(wall, 2),
                "aggregate_tokens_per_s": round(sum(r["tokens"] for r in together) / wall, 2),
                **summary(together),
            },
            "rss_gib": round(tree_rss(server.process.pid) / GiB, 2),
            "peak_rss_gib": round(peak_rss(server.process.pid) / GiB, 2),
        }
    finally:
        server.process.terminate()
        server.process.wait(120)


def run_generate(
    out: Path, ref: str = BEFORE_GENERATION, repeats: int = 3, quick: bool = False, log=print
) -> dict:
    shape = QUICK if quick else TINYLLAMA_11B
    result: dict = {
        "shape": "a two-layer Llama" if quick else "TinyLlama-1.1B",
        "prompt_tokens": PROMPT_TOKENS,
        "new_tokens": NEW_TOKENS,
        "ref": ref,
        "torch_threads": torch.get_num_threads(),
    }
    out.mkdir(parents=True, exist_ok=True)  # its scratch goes beside `out`
    vocab = shape["vocab_size"]
    prompt = np.random.default_rng(0).integers(0, vocab, PROMPT_TOKENS).tolist()
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=out.parent))).resolve()
        log(f"{result['shape']}'s shape: building a random float32 checkpoint...")
        reference = build_checkpoint("llama", work / "hf", perturb=0.0, **shape)
        log("  transformers' generate...")
        runs, want = transformers_runs(reference, prompt, repeats)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        result["transformers"] = {**summary(runs), "peak_rss_gib": round(peak / GiB, 2)}
        del reference
        gc.collect()
        log("  onnxruntime-genai: its builder, then its generation...")
        python = genai_python(log)
        start = time.perf_counter()
        genai_dir = work / "genai"
        subprocess.run(
            [str(python), str(DRIVER), "build", str(work / "hf"), str(genai_dir)],
            check=True,
            capture_output=True,
        )
        built = time.perf_counter() - start
        timed = subprocess.run(
            [str(python), str(DRIVER), "time", str(genai_dir), json.dumps(prompt),
             str(NEW_TOKENS), str(repeats)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        genai = json.loads(timed.stdout.strip().splitlines()[-1])
        result["onnxruntime_genai"] = {
            **summary(genai["runs"]),
            "version": genai["version"],
            "build_s": round(built, 1),
            "peak_rss_gib": round(genai["peak_rss"] / GiB, 2),
            "same_tokens_as_transformers": genai["token_ids"] == want,
        }
        log("  attnserve export --from-hf, float32 and int8...")
        model_dir = work / "model"
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "attnserve", "export", "--from-hf", str(work / "hf"),
             "--precision", "fp32", "--precision", "int8", "--out", str(model_dir)],
            check=True, capture_output=True,
        )  # fmt: skip
        result["export_s"] = round(time.perf_counter() - start, 1)
        for precision in ("fp32", "int8"):
            served = attnserve_runs(model_dir, precision, prompt, vocab, repeats, log)
            tokens = served.pop("token_ids")
            served["same_tokens_as_transformers"] = tokens == want
            pairs = enumerate(zip(tokens, want, strict=True))
            served["agreeing_tokens"] = next((i for i, (a, b) in pairs if a != b), len(want))
            result[f"attnserve_{precision}"] = served
        log(f"  a plain Encode: {ref}'s server beside this checkout's, float32")
        server = spawn_server(model_dir, "--provider", "cpu", timeout=900)
        stack.callback(server.process.wait, 120)
        stack.callback(server.process.terminate)
        client = stack.enter_context(EncoderClient(server.address, ClientOptions(timeout_s=900)))
        result["plain"] = plain_against(stack, model_dir, ref, client, vocab, 10, runs=1)
    save(out, "generate", result, table(result))
    return result


def table(result: dict) -> str:
    genai, fp32, int8 = (
        result[name] for name in ("onnxruntime_genai", "attnserve_fp32", "attnserve_int8")
    )
    rows = {
        "transformers generate (float32)": result["transformers"],
        f"onnxruntime-genai {genai['version']} (float32)": genai,
        "attnserve float32": fp32,
        "attnserve int8": int8,
    }
    lines = [
        f"Generation, {result['shape']}'s shape (random weights), a {result['prompt_tokens']}"
        f"-token prompt, {result['new_tokens']} greedy tokens, one request at a time (medians)",
        "",
        "| engine | first token | decode tokens/s | peak RSS | greedy tokens as transformers' |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        same = row.get("same_tokens_as_transformers")
        agree = "(the reference)" if same is None else ("all" if same else "no")
        if "agreeing_tokens" in row and not same:
            agree = f"the first {row['agreeing_tokens']}"
        lines.append(
            f"| {name} | {row['first_token_ms']:.0f} ms | {row['decode_tokens_per_s']:.2f} | "
            f"{row['peak_rss_gib']} GiB | {agree} |"
        )
    lines += [
        "",
        f"| attnserve, {CONCURRENT} requests at once | aggregate tokens/s | x one request's "
        "| first token (median) | each request's decode tokens/s |",
        "|---|---|---|---|---|",
    ]
    for name, row in (("float32", fp32), ("int8", int8)):
        c = row["concurrent"]
        lines.append(
            f"| {name} | {c['aggregate_tokens_per_s']:.2f} | "
            f"{c['aggregate_tokens_per_s'] / row['decode_tokens_per_s']:.2f}x | "
            f"{c['first_token_ms']:.0f} ms | {c['decode_tokens_per_s']:.2f} |"
        )
    ratios = {
        "float32 decode / onnxruntime-genai's (target >= 0.9)": fp32["decode_tokens_per_s"]
        / genai["decode_tokens_per_s"],
        "int8 decode / attnserve float32's (target >= 2)": int8["decode_tokens_per_s"]
        / fp32["decode_tokens_per_s"],
        f"{CONCURRENT} requests' aggregate / one request's, float32 (target >= 3)": fp32[
            "concurrent"
        ]["aggregate_tokens_per_s"]
        / fp32["decode_tokens_per_s"],
        "first token, float32 / onnxruntime-genai's (target <= 1)": fp32["first_token_ms"]
        / genai["first_token_ms"],
    }
    targets = [0.9, 2.0, 3.0, 1.0]
    lines += ["", "| ratio | value | target |", "|---|---|---|"]
    for (name, value), target in zip(ratios.items(), targets, strict=True):
        met = value <= target if "first token" in name else value >= target
        lines.append(f"| {name} | {value:.2f} | {'met' if met else 'NOT met'} |")
    lines += [
        "",
        f"Export (float32 and int8, parity checked): {result['export_s']:.0f} s; "
        f"onnxruntime-genai's builder: {genai['build_s']:.0f} s. Servers' RSS after the runs: "
        f"float32 {fp32['rss_gib']} GiB, int8 {int8['rss_gib']} GiB.",
        "",
        f"| a plain Encode, {result['shape']}'s shape | {result['ref']}'s server | this checkout's "
        "| ratio |",
        "|---|---|---|---|",
        *plain_rows(result["plain"]),
    ]
    return "\n".join(lines)
