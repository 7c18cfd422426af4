"""Real sizes: import and serve checkpoints in the shapes of 0.5B to 9B models, beside
transformers' own load of the same checkpoint (`python -m perf sizes`).

Each checkpoint is made offline in bfloat16 (as the hub ships them). Then, each in a child
process whose process tree's summed RSS is sampled every half second: transformers loads
it in float32, saves it and runs a 128-token forward with attention (the reference a user
would run instead), then times its forward with attention at each length;
`attnserve export --from-hf` imports it (float32, or int8); `attnserve serve` serves it:
RSS after warm-up, after one layer's attention at 128 tokens and after every layer's hidden
states and the predictions from the logits at 128 tokens, and Encode's p50 with one
layer's attention at each length (the graph computes every layer's either way, as
transformers does). The 7-9B shapes' float32 weights (27-34 GiB) do not fit in memory
here: they are imported in int8 only, and transformers is not run on them; the 8-9B ones
(their config.json's fields as export/studied.py lists them) are written shard by shard.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from attnserve.export.studied import STUDIED
from perf.hf_checkpoints import (
    MISTRAL_7B,
    PYTHIA_14B,
    QWEN25_05B,
    TINYLLAMA_11B,
    build_checkpoint,
    build_streamed_checkpoint,
)

GiB = 2**30
LENGTHS = (8, 128, 512)
READOUTS_MESSAGE_BYTES = 256 << 20
# name -> (model_type, config fields, precisions imported, whether transformers runs it)
SHAPES = {
    "Qwen2.5-0.5B": ("qwen2", QWEN25_05B, ("fp32",), True),
    "TinyLlama-1.1B": ("llama", TINYLLAMA_11B, ("fp32", "int8"), True),
    "Pythia-1.4B": ("gpt_neox", PYTHIA_14B, ("fp32",), True),
    "Mistral-7B": ("mistral", MISTRAL_7B, ("int8",), False),
    # model_type None: STUDIED's config.json fields, written without holding the model
    "Llama-3.1-8B": (None, STUDIED["Llama-3.1-8B"], ("int8",), False),
    "gemma-2-9b": (None, STUDIED["gemma-2-9b"], ("int8",), False),
}
# --quick (the report's smoke run): a few-MB Llama, both precisions, every step.
QUICK_SHAPES = {
    "tiny Llama": (
        "llama",
        dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=600, vocab_size=400),
        ("fp32", "int8"),
        True,
    )
}  # fmt: skip
TRANSFORMERS_RUN = """
import json, statistics, sys, time, torch
from transformers import AutoModelForCausalLM
start = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32,
                                             attn_implementation="eager")
model.save_pretrained(sys.argv[2])
with torch.no_grad():
    model(torch.ones(1, 128, dtype=torch.long), output_attentions=True)
wall = time.perf_counter() - start
p50 = {}
with torch.no_grad():
    for t in map(int, sys.argv[3:]):
        runs = []
        for _ in range(5 if t < 512 else 3):
            began = time.perf_counter()
            model(torch.full((1, t), 3, dtype=torch.long), output_attentions=True)
            runs.append(time.perf_counter() - began)
        p50[t] = statistics.median(runs)
print(json.dumps({"load_save_forward_s": wall, "p50_s": p50}))
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
    """Run `command` to its end: wall seconds, the peak RSS of its process tree, and its last
    line of output if that is JSON. Its output goes to files: a pipe nobody reads while it
    runs would fill and stop it."""
    start, peak = time.perf_counter(), 0
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        with subprocess.Popen(command, stdout=stdout, stderr=stderr) as child:
            while child.poll() is None:
                peak = max(peak, tree_rss(child.pid))
                time.sleep(0.5)
        stdout.seek(0)
        stderr.seek(0)
        output, error = stdout.read().decode(), stderr.read().decode()
    if child.returncode:
        raise RuntimeError(f"{command[:4]} failed:\n{error[-2000:]}")
    result = {"seconds": round(time.perf_counter() - start, 1), "peak_gib": round(peak / GiB, 2)}
    lines = output.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        result |= json.loads(lines[-1])
    return result


def served(model_dir: Path, work: Path, precision: str) -> dict:
    """`attnserve serve` on the directory: RSS after warm-up, after one layer's attention
    for 128 tokens and after the hidden states and predictions for 128, Encode's p50 with
    one layer's attention per length, and what GetModelInfo reports of the weights."""
    from attnserve.client import ClientOptions, EncoderClient

    ports = [_free_port() for _ in range(3)]
    ready = work / f"ready-{precision}.json"
    command = [sys.executable, "-m", "attnserve", "serve", "--model", str(model_dir)]
    command += ["--port", str(ports[0]), "--http-port", str(ports[1]), "--host", "127.0.0.1"]
    command += ["--metrics-port", str(ports[2]), "--ready-file", str(ready)]
    command += ["--precision", precision]
    # every layer's hidden states for 128 tokens: 80 MB for gemma-2-9b, past the default
    command += ["--max-message-bytes", str(READOUTS_MESSAGE_BYTES)]
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as server:
        try:
            while not ready.exists():
                if server.poll() is not None:
                    raise RuntimeError(f"attnserve serve {model_dir} exited {server.returncode}")
                time.sleep(0.5)
            warm = tree_rss(server.pid)
            options = ClientOptions(max_message_bytes=READOUTS_MESSAGE_BYTES)
            with EncoderClient(f"127.0.0.1:{ports[0]}", options) as client:
                info = client.model_info()
                out = client.encode([list(range(3, 131))], attention=True, layers=[0], timeout=900)
                assert out[0].attention.shape[-1] == 128
                after = tree_rss(server.pid)
                # ... and every layer's hidden states and the predictions from the logits
                read = client.encode(
                    [list(range(3, 131))], hidden_states=True, predictions=True, timeout=900
                )
                assert read[0].hidden_states is not None and read[0].predictions is not None
                readouts = tree_rss(server.pid)
                p50 = {}
                for t in LENGTHS:
                    runs = []
                    for _ in range(5 if t < 512 else 3):
                        began = time.perf_counter()
                        client.encode([[3] * t], attention=True, layers=[0], timeout=900)
                        runs.append(time.perf_counter() - began)
                    p50[str(t)] = statistics.median(runs)
            return {
                "rss_warm_gib": round(warm / GiB, 2),
                "rss_after_attention_gib": round(after / GiB, 2),
                "rss_after_readouts_gib": round(readouts / GiB, 2),
                "weight_bytes": int(info.get("weight_bytes", 0)),
                "resident_weight_bytes": int(info.get("resident_weight_bytes", 0)),
                "attention_max_abs_diff": info.get("attention_max_abs_diff", 0.0),
                "embedding_cosine_min": info.get("embedding_cosine_min", 1.0),
                "p50_s": p50,
            }
        finally:
            server.terminate()
            server.wait(timeout=120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_sizes(out: Path, log=print, shapes: list[str] | None = None, quick: bool = False) -> dict:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    # A run of some shapes keeps the others' results from an earlier run.
    results = json.loads((out / "sizes.json").read_text()) if (out / "sizes.json").exists() else {}
    known = QUICK_SHAPES if quick else SHAPES
    for name in shapes or list(known):
        model_type, fields, precisions, with_transformers = known[name]
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            work = Path(tmp)
            log(f"{name}: building a random bfloat16 checkpoint...")
            if model_type is None:
                parameters = build_streamed_checkpoint(fields, work / "hf")
            else:
                hf = build_checkpoint(
                    model_type, work / "hf", perturb=0.0, dtype=torch.bfloat16, **fields
                )
                parameters = sum(p.numel() for p in hf.parameters())
                del hf
            result: dict = {"parameters": parameters}
            fp32_bytes = 4 * parameters
            if with_transformers:
                log(f"{name}: transformers load (float32) + save + a 128-token forward...")
                command = [sys.executable, "-c", TRANSFORMERS_RUN, str(work / "hf")]
                result["transformers"] = measured(
                    [*command, str(work / "saved"), *map(str, LENGTHS)]
                )
                fp32_bytes = sum(f.stat().st_size for f in (work / "saved").glob("*.safetensors"))
                for f in (work / "saved").iterdir():
                    f.unlink()
            result["fp32_weights_bytes"] = fp32_bytes
            for precision in precisions:
                log(f"{name}: attnserve export --from-hf --precision {precision}...")
                model_dir = work / f"model-{precision}"
                command = ["-m", "attnserve", "export", "--from-hf", str(work / "hf")]
                command += ["--precision", precision, "--out", str(model_dir)]
                try:
                    export = measured([sys.executable, *command])
                except RuntimeError as exc:  # said, and the next shape runs
                    result[precision] = {"error": str(exc).splitlines()[-1]}
                    log(f"{name}: {result[precision]['error']}")
                    continue
                disk = sum(f.stat().st_size for f in model_dir.iterdir())
                log(f"{name}: attnserve serve --precision {precision}...")
                result[precision] = {"export": export, "disk_bytes": disk}
                try:  # the import's numbers are kept whatever serving says
                    result[precision]["serve"] = served(model_dir, work, precision)
                except grpc.RpcError as exc:
                    result[precision]["error"] = f"serving: {exc.code().name} {exc.details()}"
                except RuntimeError as exc:
                    result[precision]["error"] = f"serving: {exc}"
                if "error" in result[precision]:
                    log(f"{name}: {result[precision]['error']}")
                shutil.rmtree(model_dir)
            results[name] = result
            log(json.dumps({name: result}))
            (out / "sizes.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "sizes.md").write_text(table(results) + "\n")
    log(table(results))
    return results


def table(results: dict) -> str:
    lines = [
        "| shape, precision | import: wall / peak RSS | on disk | served RSS: warm / after "
        "attention / after hidden states and predictions | p50 with attention, "
        "T = 8 / 128 / 512 | fidelity vs float32 |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        weights = r["fp32_weights_bytes"]
        reference = r.get("transformers")
        if reference:
            p50 = " / ".join(f"{reference['p50_s'][str(t)] * 1e3:.0f}" for t in LENGTHS)
            lines.append(
                f"| {name}: transformers, float32 ({weights / GiB:.2f} GiB) | load + save + "
                f"a forward {reference['load_save_forward_s']:.1f} s / {reference['peak_gib']} "
                "GiB | | | "
                f"{p50} ms | |"
            )
        for precision in ("fp32", "int8"):
            if precision not in r:
                continue
            run = r[precision]
            if "error" in run:
                lines.append(f"| {name}: attnserve, {precision} | {run['error']} | | | | |")
                continue
            export, serve = run["export"], run["serve"]
            ratio = ""
            if reference:
                ratio = (
                    f", {export['seconds'] / reference['load_save_forward_s']:.1f}x transformers'"
                )
            p50 = " / ".join(f"{serve['p50_s'][str(t)] * 1e3:.0f}" for t in LENGTHS)
            if reference:
                p50 += (
                    " ms ("
                    + " / ".join(
                        f"{reference['p50_s'][str(t)] / serve['p50_s'][str(t)]:.2f}x"
                        for t in LENGTHS
                    )
                    + " transformers' speed)"
                )
            else:
                p50 += " ms"
            most = GiB * max(
                serve[key]
                for key in ("rss_after_attention_gib", "rss_after_readouts_gib")
                if key in serve
            )
            fidelity = ""
            if precision == "int8":
                fidelity = (
                    f"attention within {serve['attention_max_abs_diff']:.3f}, cosine >= "
                    f"{serve['embedding_cosine_min']:.4f}"
                )
            lines.append(
                f"| {name}: attnserve, {precision} | {export['seconds']} s{ratio} / "
                f"{export['peak_gib']} GiB ({export['peak_gib'] * GiB / weights:.2f}x) | "
                f"{run['disk_bytes'] / GiB:.2f} GiB ({run['disk_bytes'] / weights:.2f}x) | "
                f"{serve['rss_warm_gib']} / {serve['rss_after_attention_gib']} / "
                f"{serve.get('rss_after_readouts_gib', '-')} GiB "
                f"({serve['rss_warm_gib'] * GiB / weights:.2f}x / {most / weights:.2f}x) | "
                f"{p50} | {fidelity} |"
            )
    return "\n".join(lines)
