"""`python -m perf features`: what sparse-autoencoder features cost.

On gemma-2-2b's shape (random weights, 26 layers, d 2304, float32, imported by `attnserve
export --from-hf`): JumpReLU SAEs of 4k, 16k and 32k features on layer 12's residual
stream and one 16k SAE on every layer's (Gemma Scope's layout), added by `attnserve sae
add` and served by `attnserve serve`. Encode at T = 128 in alternating blocks: the
embeddings alone (a plain request), each width's top 10 features at every position, and
the 26 layers' at once. Issue 69's target: a 16k SAE adds at most 15% to the plain
request. The server's resident and peak memory with every SAE beside the model (the
target: the 26 beside the float32 model on this 24 GiB machine).

Then a plain request before and after, on SmolLM2-135M's shape with an SAE in its
directory: `--ref`'s server (the commit before features were served) alternating with this
checkout's, p50 at T = 8 and 128 (target: within 2%).

`--llama-8b` instead: Llama-3.1-8B's shape (random bfloat16, imported in int8 with float32
arithmetic, as its gate asks) with a 32k Llama Scope-shaped SAE (its own directory format)
added in int8 on layer 15's residual stream: disk, resident and peak memory, and Encode at
T = 128 with and without the SAE's top 10 (the target: it is served on this 24 GiB machine).
"""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from attnserve.bench.results import save
from attnserve.bench.timing import p50_ms, repeated
from attnserve.client import ClientOptions, EncoderClient
from attnserve.export.studied import STUDIED
from attnserve.service.process import ServerProcess, spawn_server
from perf.hf_checkpoints import GEMMA2_2B, SMOLLM2_135M, build_checkpoint, build_streamed_checkpoint
from perf.readouts import plain_against, plain_rows
from perf.sizes import tree_rss

BEFORE_FEATURES = "bba3bb5"  # the last commit before features were served
WIDTHS = (4096, 16384, 32768)
LAYER_WIDTH = 16384  # one per layer, as Gemma Scope's canonical residual SAEs
T = 128
FEATURE_TARGET = 1.15
TOP_K = 10
PLAIN_RUNS = 3
GiB = 2**30


def write_sae(path: Path, d_in: int, d_sae: int, hook: str, seed: int) -> Path:
    """A random JumpReLU SAE in SAELens' format (Gemma Scope's kind: b_dec not subtracted)."""
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True)
    cfg = {"architecture": "jumprelu", "d_in": d_in, "d_sae": d_sae}
    cfg |= {"apply_b_dec_to_input": False, "metadata": {"hook_name": hook}}
    (path / "cfg.json").write_text(json.dumps(cfg))
    weights = {
        "W_enc": rng.standard_normal((d_in, d_sae), np.float32) / d_in**0.5,
        "W_dec": rng.standard_normal((d_sae, d_in), np.float32) / d_sae**0.5,
        "b_enc": np.zeros(d_sae, np.float32),
        "b_dec": np.zeros(d_in, np.float32),
        "threshold": np.full(d_sae, 1.0, np.float32),
    }
    save_file(weights, path / "sae_weights.safetensors")
    return path


def write_llama_scope(path: Path, d_in: int, d_sae: int, hook: str, seed: int) -> Path:
    """A random Llama Scope SAE directory (hyperparams.json, checkpoints/final.safetensors;
    its dataset-wide input norm set to sqrt(d_in), so folding it changes nothing)."""
    rng = np.random.default_rng(seed)
    (path / "checkpoints").mkdir(parents=True)
    cfg = {"d_model": d_in, "d_sae": d_sae, "hook_point_in": hook, "hook_point_out": hook}
    cfg |= {"jump_relu_threshold": 1.0, "norm_activation": "dataset-wise"}
    cfg |= {"dataset_average_activation_norm": {"in": d_in**0.5, "out": d_in**0.5}}
    (path / "hyperparams.json").write_text(json.dumps(cfg))
    weights = {
        "encoder.weight": rng.standard_normal((d_sae, d_in), np.float32) / d_in**0.5,
        "encoder.bias": np.zeros(d_sae, np.float32),
        "decoder.weight": rng.standard_normal((d_in, d_sae), np.float32) / d_sae**0.5,
        "decoder.bias": np.zeros(d_in, np.float32),
    }
    save_file(weights, path / "checkpoints" / "final.safetensors")
    return path


def import_model(work: Path, family: str, shape: dict, name: str, log) -> Path:
    log(f"{name}'s shape: building a random checkpoint and importing it...")
    build_checkpoint(family, work / f"{name}-hf", perturb=0.0, **shape)
    model_dir = work / name
    command = [sys.executable, "-m", "attnserve", "export", "--from-hf", str(work / f"{name}-hf")]
    command += ["--out", str(model_dir), "--max-seq-len", "512"]
    subprocess.run(command, check=True, capture_output=True)
    return model_dir


def add(model_dir: Path, source: Path, name: str, *extra: str) -> None:
    command = [sys.executable, "-m", "attnserve", "sae", "add", str(model_dir), str(source)]
    subprocess.run([*command, "--name", name, *extra], check=True, capture_output=True)


def served(
    model_dir: Path, stack: contextlib.ExitStack, result: dict, *extra: str
) -> tuple[ServerProcess, EncoderClient, list[int]]:
    """`attnserve serve` of `model_dir` (`extra` its options) and a client of it, what model
    info and the server's RSS say of its weights written into `result`, and T random ids."""
    server = spawn_server(model_dir, "--provider", "cpu", *extra, timeout=900)
    stack.callback(server.process.wait, 120)
    stack.callback(server.process.terminate)
    client = stack.enter_context(EncoderClient(server.address, ClientOptions(timeout_s=900)))
    info = client.model_info()
    result["weight_gib"] = round(info["weight_bytes"] / GiB, 2)
    result["resident_weight_gib"] = round(info["resident_weight_bytes"] / GiB, 2)
    result["rss_loaded_gib"] = round(tree_rss(server.process.pid) / GiB, 2)
    ids = np.random.default_rng(0).integers(0, info["vocab_size"], size=T).tolist()
    return server, client, ids


def peak_rss(pid: int) -> int:
    """The process's peak resident memory (VmHWM)."""
    return memory_status(pid)["VmHWM"]


def memory_status(pid: int) -> dict[str, int]:
    """The process's memory counters in bytes, by /proc/PID/status name: VmHWM (its peak
    resident memory), VmRSS (now), RssAnon (its own pages), RssFile (mapped files' pages:
    a page mapped twice counts twice)."""
    fields = (line.split(":") for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {name: int(value.split()[0]) * 1024 for name, value in fields if value.endswith("kB")}


def run_features(out: Path, ref: str = BEFORE_FEATURES, repeats: int = 10, log=print) -> dict:
    result: dict = {"ref": ref, "seq_len": T, "top_k": TOP_K}
    out.mkdir(parents=True, exist_ok=True)  # its scratch goes beside `out`
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=out.parent))).resolve()
        model_dir = import_model(work, "gemma2", GEMMA2_2B, "gemma-2-2b", log)
        d, layers = GEMMA2_2B["hidden_size"], GEMMA2_2B["num_hidden_layers"]
        log(f"  adding SAEs of {', '.join(map(str, WIDTHS))} features on layer 12...")
        for width in WIDTHS:
            source = write_sae(work / f"w{width}", d, width, "blocks.12.hook_resid_post", width)
            add(model_dir, source, f"12-width-{width}")
        log(f"  adding a {LAYER_WIDTH}-feature SAE on each of the {layers} layers...")
        for layer in range(layers):
            hook = f"blocks.{layer}.hook_resid_post"
            source = write_sae(work / f"layer{layer}", d, LAYER_WIDTH, hook, layer)
            add(model_dir, source, f"{layer}-res-16k")
            log(f"    layer {layer} added")
        result["sae_disk_gib"] = round(
            sum(f.stat().st_size for f in (model_dir / "saes").rglob("*") if f.is_file()) / GiB, 2
        )

        log("  serving it...")
        server, client, ids = served(model_dir, stack, result)
        every_layer = [f"{layer}-res-16k" for layer in range(layers)]
        requests: dict[str, dict] = {"embeddings": {}}
        for width in WIDTHS:
            features = {"saes": [f"12-width-{width}"], "top_k": TOP_K}
            requests[f"{width // 1024}k SAE, top {TOP_K}"] = {"features": features}
        every = {"saes": every_layer, "top_k": TOP_K}
        requests[f"{layers} layers' 16k SAEs, top {TOP_K}"] = {"features": every}
        # without the error norm: the decoders unread
        skip = {"skip_error_norm": True}
        one = {"saes": [f"12-width-{LAYER_WIDTH}"], "top_k": TOP_K}
        requests[f"16k SAE, top {TOP_K}, no error norm"] = {"features": one | skip}
        requests[f"{layers} layers', no error norm"] = {"features": every | skip}
        calls: dict[str, Callable[[], object]] = {
            name: functools.partial(client.encode, [ids], **options)
            for name, options in requests.items()
        }
        log(f"  T = {T}: {', '.join(calls)}")
        times = repeated(calls, repeats)
        result["p50_ms"] = {name: round(p50_ms(s), 2) for name, s in times.items()}
        result["rss_after_gib"] = round(tree_rss(server.process.pid) / GiB, 2)
        result["peak_rss_gib"] = round(peak_rss(server.process.pid) / GiB, 2)
        server.process.terminate()
        server.process.wait(120)
        result["plain"] = plain_before_after(work, ref, repeats, stack, log)
    save(out, "features", result, table(result))
    return result


def run_llama_scope(out: Path, repeats: int = 1, log=print) -> dict:
    """Llama-3.1-8B's shape in int8 with a 32k Llama Scope-shaped SAE in int8 beside it."""
    fields = STUDIED["Llama-3.1-8B"]
    d, width, hook = fields["hidden_size"], 32768, "blocks.15.hook_resid_post"
    result: dict = {"seq_len": T, "top_k": TOP_K, "width": width, "hook": hook}
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=out.parent))).resolve()
        log("Llama-3.1-8B's shape: writing a random bfloat16 checkpoint...")
        build_streamed_checkpoint(fields, work / "hf")
        log("  importing it in int8 (float32 arithmetic)...")
        model_dir = work / "Llama-3.1-8B"
        command = [sys.executable, "-m", "attnserve", "export", "--from-hf", str(work / "hf")]
        command += ["--out", str(model_dir), "--precision", "int8"]
        subprocess.run([*command, "--int8-arithmetic", "float32"], check=True, capture_output=True)
        log(f"  adding a {width}-feature Llama Scope-shaped SAE in int8 on {hook}...")
        add(
            model_dir,
            write_llama_scope(work / "LXR-32x", d, width, hook, 0),
            "L15R",
            "--precision",
            "int8",
        )
        sizes = {p.name: p.stat().st_size for p in (model_dir / "saes" / "L15R").iterdir()}
        result["sae_disk_gib"] = round(sum(sizes.values()) / GiB, 3)
        log("  serving it...")
        server, client, ids = served(model_dir, stack, result, "--precision", "int8")
        features = {"saes": ["L15R"], "top_k": TOP_K}
        calls: dict[str, Callable[[], object]] = {
            "embeddings": functools.partial(client.encode, [ids]),
            f"32k SAE, top {TOP_K}": functools.partial(client.encode, [ids], features=features),
        }
        log(f"  T = {T}: {', '.join(calls)}")
        times = repeated(calls, repeats)
        result["p50_ms"] = {name: round(p50_ms(s), 2) for name, s in times.items()}
        result["rss_after_gib"] = round(tree_rss(server.process.pid) / GiB, 2)
        result["peak_rss_gib"] = round(peak_rss(server.process.pid) / GiB, 2)
    lines = [f"| Llama-3.1-8B's shape, int8, Encode at T = {T} | p50 | ratio |", "|---|---|---|"]
    plain = result["p50_ms"]["embeddings"]
    lines += [f"| {n} | {ms:.0f} ms | {ms / plain:.2f}x |" for n, ms in result["p50_ms"].items()]
    lines.append(
        f"\nThe SAE {result['sae_disk_gib']} GiB on disk beside {result['weight_gib']} GiB of "
        f"weights; resident weights {result['resident_weight_gib']} GiB; server RSS "
        f"{result['rss_loaded_gib']} GiB loaded, {result['rss_after_gib']} GiB after, peak "
        f"{result['peak_rss_gib']} GiB."
    )
    save(out, "features-llama-8b", result, "\n".join(lines))
    return result


def plain_before_after(work: Path, ref: str, repeats: int, stack, log) -> list[dict]:
    """A plain request's p50 on `ref`'s server and this checkout's, alternating, on
    SmolLM2-135M's shape with an SAE in its directory."""
    model_dir = import_model(work, "llama", SMOLLM2_135M, "SmolLM2-135M", log)
    hook = f"blocks.{SMOLLM2_135M['num_hidden_layers'] - 1}.hook_resid_post"
    add(model_dir, write_sae(work / "small", SMOLLM2_135M["hidden_size"], 4096, hook, 0), "sae")
    log(f"  a plain request: {ref}'s server beside this checkout's, on one model directory")
    after = spawn_server(model_dir, "--provider", "cpu")
    stack.callback(after.process.wait, 60)
    stack.callback(after.process.terminate)
    client = stack.enter_context(EncoderClient(after.address, ClientOptions(timeout_s=300)))
    vocab = SMOLLM2_135M["vocab_size"]
    return plain_against(stack, model_dir, ref, client, vocab, repeats * 3, PLAIN_RUNS)


def table(result: dict) -> str:
    p50 = result["p50_ms"]
    plain = p50["embeddings"]
    lines = [
        f"| gemma-2-2b's shape, float32, Encode at T = {result['seq_len']} | p50 | ratio |",
        "|---|---|---|",
    ]
    for name, ms in p50.items():
        lines.append(f"| {name} | {ms:.1f} ms | {ms / plain:.2f}x |")
    ratio = p50[f"16k SAE, top {result['top_k']}"] / plain
    verdict = "met" if ratio <= FEATURE_TARGET else "missed"
    lines += [
        "",
        f"A 16k SAE: {ratio:.2f}x the plain request (target <= {FEATURE_TARGET}x: {verdict}). "
        f"Weights {result['weight_gib']} GiB on disk, the SAEs {result['sae_disk_gib']} GiB; "
        f"resident weights (model info) {result['resident_weight_gib']} GiB; server RSS "
        f"{result['rss_loaded_gib']} GiB loaded, {result['rss_after_gib']} GiB after the "
        f"requests, peak {result['peak_rss_gib']} GiB.",
        "",
        f"| a plain request, SmolLM2-135M's shape | {result['ref']}'s server | this "
        "checkout's | ratio |",
        "|---|---|---|---|",
    ]
    return "\n".join(lines + plain_rows(result["plain"]))
