"""Real sizes: import and serve checkpoints in the shapes of 0.5-1.1B models, beside
transformers' own load of the same checkpoint (`python -m benchmarks sizes`).

Each checkpoint is made offline in bfloat16 (as the hub ships them), then, each in a child
process whose process tree's summed RSS is sampled every half second: transformers loads
it in float32, saves it and runs one 128-token forward with attention (the reference a
user would run instead); `attnserve export --from-hf` imports it; `attnserve serve` serves
it, measured after warm-up and after an Encode of one layer's attention at 128 tokens.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.hf_checkpoints import QWEN25_05B, build_checkpoint

GiB = 2**30
TINYLLAMA_11B = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    vocab_size=32000,
)
SHAPES = {"Qwen2.5-0.5B": ("qwen2", QWEN25_05B), "TinyLlama-1.1B": ("llama", TINYLLAMA_11B)}
TRANSFORMERS_RUN = """
import sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32,
                                             attn_implementation="eager")
model.save_pretrained(sys.argv[2])
with torch.no_grad():
    model(torch.ones(1, 128, dtype=torch.long), output_attentions=True)
"""


def tree_rss(pid: int) -> int:
    """The summed VmRSS of a process and its descendants."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(status.split("VmRSS:")[1].split()[0]) * 1024
            for task in os.listdir(f"/proc/{p}/task"):
                stack += map(int, Path(f"/proc/{p}/task/{task}/children").read_text().split())
        except (OSError, IndexError):
            continue  # gone, or a zombie without memory
    return total


def measured(command: list[str]) -> dict:
    """Run `command` to its end: wall seconds and the peak RSS of its process tree."""
    start, peak = time.perf_counter(), 0
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as child:
        while child.poll() is None:
            peak = max(peak, tree_rss(child.pid))
            time.sleep(0.5)
        error = child.stderr.read().decode() if child.stderr else ""
    if child.returncode:
        raise RuntimeError(f"{command[:4]} failed:\n{error[-2000:]}")
    return {"seconds": round(time.perf_counter() - start, 1), "peak_gib": round(peak / GiB, 2)}


def served(model_dir: Path, work: Path) -> dict:
    """`attnserve serve` on the directory: RSS after warm-up and after one layer's attention
    for 128 tokens, and what GetModelInfo reports of the weights."""
    from attnserve.client import EncoderClient

    ports = [_free_port() for _ in range(3)]
    ready = work / "ready.json"
    command = [sys.executable, "-m", "attnserve", "serve", "--model", str(model_dir)]
    command += ["--port", str(ports[0]), "--http-port", str(ports[1])]
    command += ["--metrics-port", str(ports[2]), "--ready-file", str(ready), "--host", "127.0.0.1"]
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as server:
        try:
            while not ready.exists():
                if server.poll() is not None:
                    raise RuntimeError(f"attnserve serve {model_dir} exited {server.returncode}")
                time.sleep(0.5)
            warm = tree_rss(server.pid)
            with EncoderClient(f"127.0.0.1:{ports[0]}") as client:
                info = client.model_info()
                ids = list(range(3, 3 + 128))
                out = client.encode([ids], attention=True, layers=[0], timeout=600)
                assert out[0].attention.shape[-1] == 128
            return {
                "rss_warm_gib": round(warm / GiB, 2),
                "rss_after_attention_gib": round(tree_rss(server.pid) / GiB, 2),
                "weight_bytes": int(info["weight_bytes"]),
                "resident_weight_bytes": int(info["resident_weight_bytes"]),
            }
        finally:
            server.terminate()
            server.wait(timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_sizes(out: Path, log=print) -> dict:
    import torch

    results = {}
    for name, (model_type, fields) in SHAPES.items():
        with tempfile.TemporaryDirectory(dir=out.parent if out.parent.exists() else None) as tmp:
            work = Path(tmp)
            log(f"{name}: building a random bfloat16 checkpoint...")
            build_checkpoint(model_type, work / "hf", perturb=0.0, dtype=torch.bfloat16, **fields)
            log(f"{name}: transformers load (float32) + save + a 128-token forward...")
            reference = measured(
                [sys.executable, "-c", TRANSFORMERS_RUN, str(work / "hf"), str(work / "saved")]
            )
            fp32_bytes = sum(f.stat().st_size for f in (work / "saved").glob("*.safetensors"))
            log(f"{name}: attnserve export --from-hf...")
            command = ["-m", "attnserve", "export", "--from-hf", str(work / "hf")]
            export = measured([sys.executable, *command, "--out", str(work / "model")])
            disk = sum(f.stat().st_size for f in (work / "model").iterdir())
            log(f"{name}: attnserve serve...")
            serve = served(work / "model", work)
            results[name] = {
                "fp32_weights_gib": round(fp32_bytes / GiB, 2),
                "transformers": reference,
                "export": export,
                "disk_gib": round(disk / GiB, 2),
                "serve": serve,
                "ratios": {
                    "import_peak_x_weights": round(export["peak_gib"] * GiB / fp32_bytes, 2),
                    "import_time_x_transformers": round(
                        export["seconds"] / reference["seconds"], 2
                    ),
                    "disk_x_weights": round(disk / fp32_bytes, 2),
                    "served_rss_x_weights": round(serve["rss_warm_gib"] * GiB / fp32_bytes, 2),
                },
            }
            log(json.dumps(results[name]))
    out.mkdir(parents=True, exist_ok=True)
    (out / "sizes.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "sizes.md").write_text(table(results) + "\n")
    log(table(results))
    return results


def table(results: dict) -> str:
    lines = [
        "| shape | fp32 weights | import: wall / peak RSS | transformers load+save+forward: "
        "wall / peak RSS | on disk | served RSS warm / after attention |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        ratios = r["ratios"]
        lines.append(
            f"| {name} | {r['fp32_weights_gib']} GiB | {r['export']['seconds']} s / "
            f"{r['export']['peak_gib']} GiB ({ratios['import_peak_x_weights']}x) | "
            f"{r['transformers']['seconds']} s / {r['transformers']['peak_gib']} GiB "
            f"(import {ratios['import_time_x_transformers']}x its time) | {r['disk_gib']} GiB "
            f"({ratios['disk_x_weights']}x) | {r['serve']['rss_warm_gib']} / "
            f"{r['serve']['rss_after_attention_gib']} GiB ({ratios['served_rss_x_weights']}x) |"
        )
    return "\n".join(lines)
