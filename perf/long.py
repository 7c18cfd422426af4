"""`python -m perf long`: attention statistics of long texts, Llama-3.2-1B's shape, float32.

A random float32 checkpoint of Llama-3.2-1B's shape (16 layers, 32 query and 8 key/value
heads of 64, d 2048) built by transformers and imported by `attnserve export --from-hf
--max-seq-len 8192`. At T = 1k, 2k, 4k and 8k tokens, one request each on a server of its
own (so that each server's peak memory is its requests' alone): the embeddings alone, and
the statistics (every layer's and head's top-8 keys per row, received attention and row
entropy, with the embeddings); beside them transformers' eager attention in a process of its
own where it fits: its forward, and its forward with every layer's map kept (what the
statistics would be computed from there). Time and peak resident memory of each. Issue
72's targets at 8k: the statistics' server under its float32 weights + 3 GiB, in at most
2x the time of the embeddings alone.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from attnserve.bench.results import save
from attnserve.client import ClientOptions, EncoderClient
from attnserve.model.artifacts import WEIGHTS_FILENAMES
from attnserve.service.process import spawn_server
from perf.features import peak_rss
from perf.hf_checkpoints import LLAMA32_1B, build_checkpoint
from perf.sizes import measured

LENGTHS = (1024, 2048, 4096, 8192)
QUICK = dict(LLAMA32_1B, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=8, num_key_value_heads=2, vocab_size=1000)  # fmt: skip
QUICK_LENGTHS = (256, 512)
TOP_K = 8
MESSAGE_BYTES = 2**31 - 1  # gRPC's largest: 8k tokens' statistics are 0.3 GB
GiB = 2**30
HEADROOM = 3 * GiB  # the target: the server under its float32 weights plus this


def eager_fits(shape: dict, t: int, keep_maps: bool, available: int) -> bool:
    """Whether transformers' eager forward at `t` tokens fits in `available` bytes: its
    float32 weights and, per layer, a few T x T score tensors (every layer's map kept)."""
    params = 12 * shape["num_hidden_layers"] * shape["hidden_size"] ** 2  # a lower bound
    params += shape["vocab_size"] * shape["hidden_size"]
    square = shape["num_attention_heads"] * t * t * 4
    maps = square * (shape["num_hidden_layers"] + 2 if keep_maps else 3)
    return params * 4 + maps < available * 0.8


def eager(hf_dir: Path, t: int, keep_maps: bool) -> dict:
    """transformers' eager forward at `t` tokens in a process of its own: seconds, peak GiB."""
    command = [sys.executable, "-m", "perf.long", "eager", str(hf_dir), str(t)]
    return measured([*command, "keep" if keep_maps else "forward"])


def _eager_child(hf_dir: str, t: int, mode: str) -> None:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, attn_implementation="eager", dtype=torch.float32
    ).eval()
    ids = torch.from_numpy(np.random.default_rng(0).integers(3, 1000, (1, t)))
    with torch.no_grad():
        start = time.perf_counter()
        out = model.base_model(ids, output_attentions=mode == "keep")
        seconds = time.perf_counter() - start
    assert out.last_hidden_state.shape[1] == t
    print(json.dumps({"forward_s": round(seconds, 2)}))


def _memory(pid: int) -> dict[str, int]:
    """The process's resident memory now: private (RssAnon) and file-backed (RssFile)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return {
        key: int(status.split(f"{key}:")[1].split()[0]) * 1024 for key in ("RssAnon", "RssFile")
    }


class PeakMemory:
    """Samples a process's private and file-backed resident memory every 50 ms while in use:
    their peaks (the kernel keeps only the total's, VmHWM)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, {"RssAnon": 0, "RssFile": 0}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            for key, value in _memory(self.pid).items():
                self.peak[key] = max(self.peak[key], value)
            if self._done.wait(0.05):
                return

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._done.set()
        self._thread.join()


def timed_requests(model_dir: Path, lengths: tuple[int, ...], statistics: bool, log) -> dict:
    """One server: one request per length, ascending; each one's seconds, the server's peak
    resident memory after it (VmHWM), and its private memory's peak during it (RssAnon: the
    weights' file pages, RssFile, are the page cache's, shared and reclaimable)."""
    server = spawn_server(
        model_dir, "--provider", "cpu", "--max-message-bytes", str(MESSAGE_BYTES), timeout=900
    )
    rows = {}
    options = ClientOptions(timeout_s=3600, max_message_bytes=MESSAGE_BYTES)
    try:
        with EncoderClient(server.address, options) as client:
            info = client.model_info()
            vocab = int(info["vocab_size"])
            warm = _memory(server.process.pid)
            rows["warm_rss_gib"] = round(peak_rss(server.process.pid) / GiB, 2)
            rows["warm_private_gib"] = round(warm["RssAnon"] / GiB, 2)
            rows["warm_file_gib"] = round(warm["RssFile"] / GiB, 2)
            for t in lengths:
                ids = np.random.default_rng(t).integers(3, vocab, t).tolist()
                asked = dict(top_k=TOP_K, received=True, row_entropy=True) if statistics else {}
                with PeakMemory(server.process.pid) as sampled:
                    start = time.perf_counter()
                    (got,) = client.encode([ids], **asked)
                    seconds = time.perf_counter() - start
                if statistics:
                    assert got.attention_received is not None and got.indices is not None
                    assert got.attention.shape[2:] == (t, TOP_K)
                peak = peak_rss(server.process.pid)
                private = sampled.peak["RssAnon"]
                rows[str(t)] = {
                    "seconds": round(seconds, 3),
                    "peak_rss_gib": round(peak / GiB, 2),
                    "peak_private_gib": round(private / GiB, 2),
                    "peak_file_gib": round(sampled.peak["RssFile"] / GiB, 2),
                }
                log(
                    f"    T={t}: {seconds:.1f} s, server peak {peak / GiB:.2f} GiB "
                    f"({private / GiB:.2f} GiB private)"
                )
    finally:
        server.process.terminate()
        server.process.wait(120)
    return rows


def run_long(
    out: Path,
    quick: bool = False,
    log=print,
    lengths: tuple[int, ...] | None = None,
    eager_runs: bool = True,
) -> dict:
    shape, lengths = (
        (QUICK, lengths or QUICK_LENGTHS) if quick else (LLAMA32_1B, lengths or LENGTHS)
    )
    result: dict = {"shape": "a two-layer Llama" if quick else "Llama-3.2-1B", "top_k": TOP_K}
    result["eager_runs"] = eager_runs
    out.mkdir(parents=True, exist_ok=True)  # its scratch goes beside `out`
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=out.parent))).resolve()
        log(f"{result['shape']}'s shape: building a random float32 checkpoint...")
        build_checkpoint("llama", work / "hf", perturb=0.0, **shape)
        log(f"  attnserve export --from-hf --max-seq-len {max(lengths)}...")
        model_dir = work / "model"
        result["export"] = measured(
            [sys.executable, "-m", "attnserve", "export", "--from-hf", str(work / "hf"),
             "--max-seq-len", str(max(lengths)), "--out", str(model_dir)]
        )  # fmt: skip
        result["weights_gib"] = round(
            (model_dir / WEIGHTS_FILENAMES["fp32"]).stat().st_size / GiB, 2
        )
        log("  the embeddings alone:")
        result["embeddings"] = timed_requests(model_dir, lengths, False, log)
        log(f"  the statistics (top {TOP_K}, received, row entropy, every layer and head):")
        result["statistics"] = timed_requests(model_dir, lengths, True, log)
        available = _available_bytes()
        for mode, keep in (("eager_forward", False), ("eager_maps", True)):
            result[mode] = {}
            for t in lengths:
                if eager_runs and eager_fits(shape, t, keep, available):
                    log(f"  transformers eager ({mode}) at T={t}...")
                    result[mode][str(t)] = eager(work / "hf", t, keep)
    longest = str(max(lengths))
    stats, alone = result["statistics"][longest], result["embeddings"][longest]
    limit = result["weights_gib"] + HEADROOM / GiB
    result["targets"] = {
        "memory_limit_gib": round(limit, 2),
        "memory_met": stats["peak_private_gib"] <= limit,
        "rss_met": stats["peak_rss_gib"] <= limit,
        "time_ratio": round(stats["seconds"] / alone["seconds"], 2),
        "time_met": stats["seconds"] <= 2 * alone["seconds"],
    }
    save(out, "long", result, table(result, lengths))
    _plot(result, lengths, out / "long.png")
    return result


def _available_bytes() -> int:
    meminfo = Path("/proc/meminfo").read_text()
    return int(meminfo.split("MemAvailable:")[1].split()[0]) * 1024


def table(result: dict, lengths: tuple[int, ...]) -> str:
    lines = [
        f"Long texts, {result['shape']}'s shape (random float32 weights, "
        f"{result['weights_gib']} GiB): one request per length, each kind on a server of its "
        "own (seconds; the server's peak resident memory and, in brackets, its private part: "
        "the rest is the weights file's pages, shared and reclaimable)",
        "",
        "| T | embeddings alone | statistics (top-8, received, row entropy) | ratio "
        "| transformers eager forward | eager, every map kept |",
        "|---|---|---|---|---|---|",
    ]
    for t in map(str, lengths):
        alone, stats = result["embeddings"][t], result["statistics"][t]
        cells = [f"{r['seconds']:.1f} s, {r['peak_rss_gib']} ({r['peak_private_gib']}) GiB"
                 for r in (alone, stats)]  # fmt: skip
        cells.append(f"{stats['seconds'] / alone['seconds']:.2f}x")
        for mode in ("eager_forward", "eager_maps"):
            run = result[mode].get(t)
            cells.append(
                f"{run['forward_s']:.1f} s, {run['peak_gib']} GiB"
                if run
                else ("does not fit" if result["eager_runs"] else "not run")
            )
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    targets, stats = result["targets"], result["statistics"][str(max(lengths))]
    lines += [
        "",
        f"Warm, before any request: {result['statistics']['warm_rss_gib']} GiB resident, "
        f"{result['statistics']['warm_private_gib']} GiB private. At T = {max(lengths)}: "
        f"the statistics' server's private memory peaked at {stats['peak_private_gib']} GiB "
        f"against the target's {targets['memory_limit_gib']} GiB (weights + 3 GiB): "
        f"{'met' if targets['memory_met'] else 'missed'} (resident, file pages included, "
        f"{stats['peak_rss_gib']} GiB: {'met' if targets['rss_met'] else 'missed'}); "
        f"{targets['time_ratio']}x the "
        f"embeddings alone's time (target <= 2x): {'met' if targets['time_met'] else 'missed'}.",
    ]
    return "\n".join(lines)


def _plot(result: dict, lengths: tuple[int, ...], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for name, label in (("embeddings", "embeddings alone"), ("statistics", "statistics")):
        runs = [result[name][str(t)] for t in lengths]
        left.plot(lengths, [r["seconds"] for r in runs], marker="o", label=label)
        right.plot(lengths, [r["peak_rss_gib"] for r in runs], marker="o", label=label)
    for mode, label in (("eager_forward", "transformers eager"), ("eager_maps", "eager, maps")):
        ts = [t for t in lengths if str(t) in result[mode]]
        runs = [result[mode][str(t)] for t in ts]
        left.plot(ts, [r["forward_s"] for r in runs], marker="x", ls="--", label=label)
        right.plot(ts, [r["peak_gib"] for r in runs], marker="x", ls="--", label=label)
    right.axhline(result["targets"]["memory_limit_gib"], color="grey", ls=":", label="target")
    left.set(xlabel="tokens", ylabel="seconds", xscale="log", yscale="log", title="time")
    right.set(xlabel="tokens", ylabel="peak RSS (GiB)", xscale="log", title="memory")
    left.legend()
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__" and sys.argv[1:2] == ["eager"]:
    _eager_child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
