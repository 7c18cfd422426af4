"""`python -m perf families`: the families people study, at real models' sizes.

1. Latency across lengths, batch 1, on random weights in the shapes of SmolLM2-135M
   (Llama: 30 layers, d 576, 9 query / 3 KV heads) and Pythia-160M (GPT-NeoX: 12 layers,
   d 768, partial rotary, parallel residual), each imported by `attnserve export --from-hf`:
   ONNX Runtime on CPU (the graphs the server runs: with every attention weight; embeddings
   only) against transformers' eager implementation with `output_attentions` on and off,
   alternating blocks; then the server end to end (Encode with every weight; embeddings).
2. What importing a 0.5B-parameter model costs: `attnserve export --from-hf` of random
   weights in Qwen2.5-0.5B's shape (bfloat16 on disk, as published), its wall time and the
   peak resident memory of the export process.

`--second-round`: the shapes of gemma-2-2b, Llama-3.2-1B, Qwen3-0.6B and gemma-3-1b
(bfloat16 checkpoints), each imported in float32 (wall time, the process tree's peak RSS),
served (RSS, Encode with one layer's attention), then ONNX Runtime against transformers
eager with attention at T = 8 to 1024: one after the other, not alternating, since the two
float32 copies of a 2.6B model do not fit in memory beside each other here.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from attnserve.bench.results import save
from attnserve.bench.timing import alternate, p50_ms, timed
from attnserve.model.config import ModelConfig
from perf.hf_checkpoints import (
    GEMMA2_2B,
    GEMMA3_1B,
    LLAMA32_1B,
    PYTHIA_160M,
    QWEN3_06B,
    QWEN25_05B,
    SMOLLM2_135M,
    build_checkpoint,
)

LENGTHS = [8, 16, 32, 64, 128, 256, 512, 1024]
MODELS = {"SmolLM2-135M": ("llama", SMOLLM2_135M), "Pythia-160M": ("gpt_neox", PYTHIA_160M)}
ENGINES = ["ort-attention", "eager-attention", "ort-embeddings", "eager-embeddings"]
SERVED = ["server-attention", "server-embeddings"]
TARGET = 1.5  # ORT >= 1.5x transformers eager with attention weights on, at every length
MESSAGE_BYTES = 512 * 2**20
SECOND_ROUND = {
    "gemma-2-2b": ("gemma2", GEMMA2_2B),
    "Llama-3.2-1B": ("llama", LLAMA32_1B),
    "Qwen3-0.6B": ("qwen3", QWEN3_06B),
    "gemma-3-1b": ("gemma3_text", GEMMA3_1B),
}
SECOND_LENGTHS = [8, 128, 1024]


def export(source: Path, out: Path, max_seq_len: int) -> dict:
    """`attnserve export --from-hf` in a child process: wall seconds and the child's peak RSS."""
    probe = (
        "import resource, subprocess, sys, time; start = time.perf_counter(); "
        "code = subprocess.call(sys.argv[1:]); "
        "print(time.perf_counter() - start, "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code)"
    )
    command = [sys.executable, "-m", "attnserve", "export", "--from-hf", str(source)]
    command += ["--out", str(out), "--max-seq-len", str(max_seq_len)]
    answer = subprocess.run(
        [sys.executable, "-c", probe, *command], capture_output=True, text=True, check=True
    )
    seconds, peak_kib, code = answer.stdout.split()[-3:]
    if code != "0":
        raise RuntimeError(f"export of {source} failed:\n{answer.stderr[-2000:]}")
    report = json.loads((out / "export_report.json").read_text())
    return {
        "seconds": round(float(seconds), 1),
        "peak_rss_gib": round(int(peak_kib) / 2**20, 2),
        "parameters": report["parameters"],
        "graphs_gib": round(sum(report["onnx_bytes"].values()) / 2**30, 2),
        "external_data": sorted(p.name for p in out.glob("*.data")),
        "export_seconds": report["export_seconds"],
        "parity_seconds": report["parity_seconds"],
    }


def model_gflop(config: ModelConfig, t: int) -> float:
    """GFLOP of one run at T tokens: every projection and MLP product (2 per multiply-add)
    plus the attention products (scores and weighted values, dense T x T per head)."""
    d, dh, h, h_kv = config.d_model, config.head_dim, config.n_heads, config.kv_heads
    mlp = (3 if config.mlp == "gated" else 2) * d * config.d_ff
    per_token = d * (h + 2 * h_kv) * dh + h * dh * d + mlp
    attention = 2 * t * t * h * dh
    return config.n_layers * 2 * (t * per_token + attention) / 1e9


def matmul_gflops(n: int = 2048, repeats: int = 5) -> float:
    """torch's fp32 matmul rate on this machine now (the best of a few), for efficiency."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(timed(torch.matmul, a, b) for _ in range(repeats))
    return round(2 * n**3 / best / 1e9, 1)


def latency(
    name: str, work: Path, lengths: list[int], repeats: int, log, layers: int | None = None
) -> dict:
    """p50 ms per engine and length for one model shape (`layers`: fewer, for smoke runs)."""
    import torch

    from attnserve.client import ClientOptions, EncoderClient
    from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
    from attnserve.service.process import spawn_server

    family, fields = MODELS[name]
    if layers is not None:
        fields = {**fields, "num_hidden_layers": layers}
    log(f"{name}: building a random {family} checkpoint and exporting it...")
    reference = build_checkpoint(family, work / name, perturb=0.0, **fields)
    exported = export(work / name, work / f"{name}-model", max(lengths))
    runtime = OrtRuntime(work / f"{name}-model", RuntimeOptions(provider="cpu"))
    # Every weight of 30 layers x 9 heads at 1024 tokens: 1.1 GB from ORT, 283 MB on the wire
    # in float16 causal-packed; the default limits (1 GiB in flight, 64 MiB messages) refuse it.
    limits = ["--max-inflight-bytes", str(4 * 2**30), "--max-message-bytes", str(MESSAGE_BYTES)]
    server = spawn_server(work / f"{name}-model", "--provider", "cpu", *limits)
    options = ClientOptions(timeout_s=600, max_message_bytes=MESSAGE_BYTES)
    wire = {"attention_dtype": "float16", "attention_layout": "causal-packed"}
    rows: dict[int, dict[str, float]] = {}
    try:
        with EncoderClient(server.address, options) as client:
            for t in lengths:
                ids = np.random.default_rng(t).integers(3, 400, size=(1, t), dtype=np.int64)
                tensor = torch.from_numpy(ids)

                def eager(weights: bool, tensor=tensor) -> object:
                    with torch.inference_mode():
                        return reference.base_model(tensor, output_attentions=weights)

                calls: dict[str, Callable[[], object]] = {
                    "ort-attention": lambda ids=ids: runtime.run(ids),
                    "eager-attention": lambda: eager(True),
                    "ort-embeddings": lambda ids=ids: runtime.embed(ids),
                    "eager-embeddings": lambda: eager(False),
                    "server-attention": lambda ids=ids: client.encode(
                        [ids[0]], attention=True, **wire
                    ),
                    "server-embeddings": lambda ids=ids: client.encode([ids[0]]),
                }
                samples, _ = alternate(calls, least=repeats, most=4 * repeats, seconds=2.0)
                rows[t] = {engine: round(p50_ms(s), 3) for engine, s in samples.items()}
                rows[t]["gflop"] = round(model_gflop(runtime.config, t), 3)
                ratio = rows[t]["eager-attention"] / rows[t]["ort-attention"]
                log(
                    f"  T={t}: ORT {rows[t]['ort-attention']:.2f} ms, eager "
                    f"{rows[t]['eager-attention']:.2f} ms with attention ({ratio:.2f}x)"
                )
    finally:
        server.process.terminate()
        server.process.wait(30)
    config = runtime.config
    shape = (
        f"{config.n_layers} layers, d_model {config.d_model}, {config.n_heads} query / "
        f"{config.kv_heads} KV heads, head_dim {config.head_dim}"
    )
    return {"shape": shape, "export": exported, "p50_ms": rows}


def table(result: dict) -> str:
    """One row per model and length (p50 ms), then what importing each model cost."""
    lines = [
        "| model | T | ORT attention | eager attention | ratio | ORT embeddings "
        "| eager embeddings | ratio | server attention | server embeddings |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts, rates, imports = [], [], []
    for name, model in result["models"].items():
        for t, row in model["p50_ms"].items():
            on = row["eager-attention"] / row["ort-attention"]
            off = row["eager-embeddings"] / row["ort-embeddings"]
            lines.append(
                f"| {name} | {t} | {row['ort-attention']:.2f} | {row['eager-attention']:.2f} | "
                f"{on:.2f}x | {row['ort-embeddings']:.2f} | {row['eager-embeddings']:.2f} | "
                f"{off:.2f}x | {row['server-attention']:.2f} | {row['server-embeddings']:.2f} |"
            )
        t, row = min(
            model["p50_ms"].items(), key=lambda r: r[1]["eager-attention"] / r[1]["ort-attention"]
        )
        worst = row["eager-attention"] / row["ort-attention"]
        verdicts.append(f"{name} {worst:.2f}x at T={t} ({'met' if worst >= TARGET else 'not met'})")
        rates.append(
            f"{name} at T={t}: ORT {row['gflop'] / row['ort-attention'] * 1e3:.0f}, eager "
            f"{row['gflop'] / row['eager-attention'] * 1e3:.0f}"
        )
        imports.append(f"{name} ({model['shape']}): {_cost(model['export'])}")
    lines.append(
        f"\np50 ms, batch 1; the server's attention is every weight in float16, causal-packed, "
        f"decoded by the client. ORT / eager with attention weights at each model's worst length "
        f"(target {TARGET}x at every length): {'; '.join(verdicts)}. GFLOP/s there (the "
        f"model's products, attention included): {'; '.join(rates)}; a 2048^2 "
        f"torch fp32 matmul reached {' and '.join(map(str, result['matmul_gflops']))} "
        f"GFLOP/s before and after.\n"
    )
    if result["large_export"] is not None:
        large = result["large_export"]
        imports.append(f"{large['name']} ({large['parameters']:,} parameters): {_cost(large)}")
    return "\n".join(
        lines
        + ["Importing (`attnserve export --from-hf`, five graphs checked):\n"]
        + [f"- {line}" for line in imports]
    )


def _cost(export: dict) -> str:
    data = ", ".join(export["external_data"]) or "none"
    return (
        f"{export['seconds']} s, peak RSS {export['peak_rss_gib']} GiB, "
        f"{export['graphs_gib']} GiB of graphs (external data: {data}; export "
        f"{export['export_seconds']} s, parity {export['parity_seconds']} s)"
    )


def run_families(out: Path, quick: bool = False, log=print) -> dict:
    import torch

    lengths = LENGTHS[:3] if quick else LENGTHS
    repeats = 2 if quick else 6
    with tempfile.TemporaryDirectory(prefix="attnserve-families-") as scratch:
        work = Path(scratch)
        layers = 2 if quick else None  # a smoke run: the real widths, two layers
        matmul = [matmul_gflops()]
        models = {name: latency(name, work, lengths, repeats, log, layers) for name in MODELS}
        matmul.append(matmul_gflops())
        large = None
        if not quick:  # a 2 GB graph five times over: not for a smoke run
            log("Qwen2.5-0.5B's shape: building a random checkpoint (bfloat16 on disk)...")
            start = time.perf_counter()
            build_checkpoint(
                "qwen2", work / "qwen", perturb=0.0, dtype=torch.bfloat16, **QWEN25_05B
            )
            log(f"  built in {time.perf_counter() - start:.0f} s; exporting...")
            large = {"name": "Qwen2.5-0.5B", **export(work / "qwen", work / "qwen-model", 1024)}
    result = {
        "machine": platform.processor() or platform.machine(),
        "matmul_gflops": matmul,  # before and after the latency runs
        "lengths": lengths,
        "models": models,
        "large_export": large,
    }
    save(out, "families", result, table(result))
    return result


def second_round_shape(name: str, work: Path, repeats: int, log=print) -> dict:
    """One shape of the second round: import, serve, then ORT and eager one after the other."""
    import gc
    import shutil

    import torch

    from perf.sizes import measured, served

    family, fields = SECOND_ROUND[name]
    source, model_dir = work / name, work / f"{name}-model"
    log(f"{name}: building a random {family} checkpoint (bfloat16 on disk)...")
    build_checkpoint(family, source, perturb=0.0, dtype=torch.bfloat16, **fields)
    gc.collect()
    log(f"{name}: importing (attnserve export --from-hf, float32)...")
    command = [sys.executable, "-m", "attnserve", "export", "--from-hf", str(source)]
    command += ["--out", str(model_dir), "--max-seq-len", str(max(SECOND_LENGTHS))]
    imported = measured(command)
    report = json.loads((model_dir / "export_report.json").read_text())
    imported |= {
        "parameters": report["parameters"],
        "disk_gib": round(sum(report["onnx_bytes"].values()) / 2**30, 2),
    }
    log(f"  {imported['seconds']} s, peak {imported['peak_gib']} GiB; serving...")
    serve = served(model_dir, work, "fp32")
    rng = np.random.default_rng(0)
    inputs = {t: rng.integers(3, 400, size=(1, t), dtype=np.int64) for t in SECOND_LENGTHS}
    p50 = _ort_p50s(model_dir, inputs, repeats, log)
    gc.collect()  # the session's weights go before transformers loads its own copy
    for t, row in _eager_p50s(source, inputs, repeats, log).items():
        p50[t] |= row
    gc.collect()
    shutil.rmtree(source)
    shutil.rmtree(model_dir)
    return {"family": family, "import": imported, "serve": serve, "p50_ms": p50}  # fmt: skip


def _ort_p50s(model_dir: Path, inputs: dict, repeats: int, log) -> dict[int, dict[str, float]]:
    from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions

    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    p50 = {}
    for t, ids in inputs.items():
        calls = {
            "ort-attention": lambda ids=ids: runtime.run(ids),
            "ort-embeddings": lambda ids=ids: runtime.embed(ids),
        }
        p50[t] = _p50s(calls, repeats)
        log(f"  ORT T={t}: {p50[t]}")
    return p50


def _eager_p50s(source: Path, inputs: dict, repeats: int, log) -> dict[int, dict[str, float]]:
    import torch
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(
        source, dtype=torch.float32, attn_implementation="eager"
    ).eval()

    def eager(ids: np.ndarray, weights: bool) -> object:
        with torch.inference_mode():
            return reference.base_model(torch.from_numpy(ids), output_attentions=weights)

    p50 = {}
    for t, ids in inputs.items():
        calls = {
            "eager-attention": lambda ids=ids: eager(ids, True),
            "eager-embeddings": lambda ids=ids: eager(ids, False),
        }
        p50[t] = _p50s(calls, repeats)
        log(f"  eager T={t}: {p50[t]}")
    return p50


def _p50s(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """p50 ms per call, interleaved, after one warm-up each (a 1024-token forward of a 2B
    model takes tens of seconds: no more rounds than that)."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()
    for _ in range(repeats):
        for name, call in calls.items():
            samples[name].append(timed(call))
    return {name: round(p50_ms(s), 2) for name, s in samples.items()}


def second_round_table(result: dict) -> str:
    lines = [
        "| shape | parameters | import: wall / peak RSS | on disk | served RSS | T | ORT "
        "attention | eager attention | ratio | ORT embeddings | eager embeddings | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, shape in result["shapes"].items():
        imported, serve = shape["import"], shape["serve"]
        weights_gib = imported["parameters"] * 4 / 2**30
        for i, (t, row) in enumerate(shape["p50_ms"].items()):
            head = ["", "", "", "", ""]
            if i == 0:
                head = [
                    name,
                    f"{imported['parameters'] / 1e9:.2f}B ({weights_gib:.2f} GiB fp32)",
                    f"{imported['seconds']} s / {imported['peak_gib']} GiB "
                    f"({imported['peak_gib'] / weights_gib:.2f}x)",
                    f"{imported['disk_gib']} GiB",
                    f"{serve['rss_after_attention_gib']} GiB",
                ]
            on = row["eager-attention"] / row["ort-attention"]
            off = row["eager-embeddings"] / row["ort-embeddings"]
            lines.append(
                f"| {' | '.join(head)} | {t} | {row['ort-attention']:.1f} | "
                f"{row['eager-attention']:.1f} | {on:.2f}x | {row['ort-embeddings']:.1f} | "
                f"{row['eager-embeddings']:.1f} | {off:.2f}x |"
            )
    lines.append(
        "\np50 ms, batch 1, float32; ratio = transformers eager / ONNX Runtime (above 1: "
        "attnserve's graph is faster). Served RSS: `attnserve serve` after one layer's "
        "attention for 128 tokens. Import: `attnserve export --from-hf` of the bfloat16 "
        "checkpoint, the process tree's peak RSS against the float32 weights.\n"
    )
    return "\n".join(lines)


def run_second_round(out: Path, shapes: list[str] | None = None, log=print) -> dict:
    names = shapes or list(SECOND_ROUND)
    unknown = sorted(set(names) - set(SECOND_ROUND))
    if unknown:
        raise SystemExit(f"unknown shape(s) {unknown}; known: {sorted(SECOND_ROUND)}")
    with tempfile.TemporaryDirectory(prefix="attnserve-families-2-") as scratch:
        work = Path(scratch)
        results = {name: second_round_shape(name, work, 3, log) for name in names}
    result = {"machine": platform.processor() or platform.machine(), "shapes": results}
    save(out, "families_second_round", result, second_round_table(result))
    return result
