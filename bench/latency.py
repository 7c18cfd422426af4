"""Latency across sequence lengths and batch sizes, every engine side by side in one run.

Engines share the same weights and inputs. Each cell (engine x batch x length)
is timed in ROUNDS blocks that alternate between engines, so slow drifts of a
shared machine hit every engine alike; ratios against the PyTorch engine with
the same outputs are what to read.
"""

from __future__ import annotations

import csv
import functools
import json
import platform
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from attnserve.bench.engines import (
    BASELINES,
    DEFAULT_ENGINES,
    GRPC_MESSAGE_LIMIT,
    Engine,
    TooLarge,
    build_engines,
)
from attnserve.bench.results import progress
from attnserve.bench.timing import alternate, timed
from attnserve.client import EncoderClient
from attnserve.export.model_dir import write_model_dir
from attnserve.model.config import ModelConfig
from attnserve.model.encoder import Encoder, build_encoder
from attnserve.service.process import spawn_server

SEQ_LENS = (8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class Row:
    engine: str
    batch: int
    seq_len: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    samples: int
    gflops: float | None  # model FLOPs of one call / p50
    pct_of_peak: float | None  # gflops / the matmul peak measured in the same run
    skipped: str | None = None  # why the cell was not measured


def model_flops(config: ModelConfig, batch: int, seq_len: int) -> int:
    """Multiply-adds x 2 of one forward pass (matmuls only; the full T x T scores are computed)."""
    d, t = config.d_model, seq_len
    per_layer = (
        2 * t * d * 3 * d  # fused Q, K, V projection
        + 2 * 2 * t * t * d  # Q K^T and A V over all heads
        + 2 * t * d * d  # output projection
        + 2 * 2 * t * d * config.d_ff  # MLP
    )
    return batch * config.n_layers * per_layer


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Best-of-n fp32 matmul rate on this machine, the yardstick for efficiency."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(timed(torch.matmul, a, b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _budget(quick: bool) -> tuple[int, int, float]:
    """(min samples, max samples, seconds) per engine and cell, over all rounds."""
    return (3, 6, 0.3) if quick else (6, 60, 2.0)


def measure_cell(engines: dict[str, Engine], ids: np.ndarray, quick: bool) -> dict:
    """Samples (s) per engine, or the reason an engine could not run this cell."""
    least, most, seconds = _budget(quick)
    calls = {name: functools.partial(run, ids) for name, run in engines.items()}
    samples, skipped = alternate(calls, least, most, seconds, skip_on=TooLarge)
    return {"samples": samples, "skipped": skipped}


def sweep(
    model: Encoder,
    engines: dict[str, Engine],
    seq_lens: list[int],
    batch_sizes: list[int],
    peak: float,
    quick: bool = False,
) -> list[Row]:
    rng = np.random.default_rng(0)
    rows = []
    cells = [(b, t) for b in batch_sizes for t in seq_lens]
    for batch, seq_len in tqdm(cells, desc="latency sweep", unit="cell", file=sys.stderr):
        ids = rng.integers(0, model.config.vocab_size, size=(batch, seq_len), dtype=np.int64)
        result = measure_cell(engines, ids, quick)
        flops = model_flops(model.config, batch, seq_len)
        for name in engines:
            if name in result["skipped"]:
                rows.append(
                    Row(
                        name,
                        batch,
                        seq_len,
                        None,
                        None,
                        None,
                        0,
                        None,
                        None,
                        result["skipped"][name],
                    )
                )
                continue
            ms = np.asarray(result["samples"][name]) * 1e3
            p50, p90, p99 = np.percentile(ms, [50, 90, 99])
            gflops = flops / (p50 / 1e3) / 1e9
            rows.append(
                Row(
                    name,
                    batch,
                    seq_len,
                    round(p50, 4),
                    round(p90, 4),
                    round(p99, 4),
                    len(ms),
                    round(gflops, 2),
                    round(100 * gflops / peak, 1),
                )
            )
        tqdm.write(
            f"batch {batch} seq_len {seq_len:>4}: "
            + "  ".join(f"{r.engine} {r.p50_ms:.2f}" for r in rows[-len(engines) :] if r.p50_ms),
            file=sys.stderr,
        )
    return rows


def markdown_table(rows: list[Row], batch: int) -> str:
    """p50 per engine for one batch size; each ratio against the engine's PyTorch baseline."""
    cells: dict[int, dict[str, Row]] = {}
    for r in rows:
        if r.batch == batch:
            cells.setdefault(r.seq_len, {})[r.engine] = r
    engines = list(dict.fromkeys(r.engine for r in rows))
    lines = [
        "| seq len | " + " | ".join(engines) + " |",
        "|---|" + "---|" * len(engines),
    ]
    for seq_len, cell in sorted(cells.items()):
        out = []
        for name in engines:
            row, base = cell[name], cell.get(BASELINES[name])
            if row.p50_ms is None:
                out.append("skipped")
            elif base is None or base is row or base.p50_ms is None:
                out.append(f"{row.p50_ms:.2f} ms")
            else:
                out.append(f"{row.p50_ms:.2f} ms ({base.p50_ms / row.p50_ms:.1f}x)")
        lines.append(f"| {seq_len} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def plot(rows: list[Row], batch_sizes: list[int], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(batch_sizes), figsize=(7 * len(batch_sizes), 5.5), squeeze=False
    )
    for ax, batch in zip(axes[0], batch_sizes, strict=True):
        for engine in dict.fromkeys(r.engine for r in rows):
            points = sorted(
                (r.seq_len, r.p50_ms)
                for r in rows
                if r.engine == engine and r.batch == batch and r.p50_ms
            )
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=engine)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("p50 latency (ms)")
        ax.set_title(f"batch {batch}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def environment(peak: float) -> dict:
    import onnxruntime

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpu": cpu,
        "cores": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "matmul_peak_gflops": round(peak, 1),
    }


def write_outputs(
    out: Path, rows: list[Row], batch_sizes: list[int], env: dict, unavailable: dict[str, str]
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "latency.json").write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    (out / "environment.json").write_text(
        json.dumps({**env, "unavailable_engines": unavailable}, indent=1) + "\n"
    )
    with (out / "latency.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    plot(rows, batch_sizes, out / "latency.png")
    tables = [f"### batch {b}\n\n{markdown_table(rows, b)}" for b in batch_sizes]
    (out / "latency.md").write_text("\n\n".join(tables) + "\n")


def run_latency(
    out: Path,
    config: ModelConfig,
    max_seq_len: int | None = None,
    batch_sizes: list[int] | None = None,
    quick: bool = False,
    engine_names: list[str] | None = None,
) -> list[Row]:
    batch_sizes = batch_sizes or [1, 8]
    limit = min(max_seq_len or config.max_seq_len, config.max_seq_len)
    seq_lens = [t for t in SEQ_LENS if t <= limit]
    names = engine_names or DEFAULT_ENGINES
    model = build_encoder(config, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        write_model_dir(model, model_dir, shapes=[(1, 1), (1, limit)], log=progress)
        server = None
        if any(n.startswith("grpc-") for n in names):
            server = spawn_server(
                model_dir, "--provider", "cpu", "--max-message-bytes", str(GRPC_MESSAGE_LIMIT)
            )
            EncoderClient(server.address).wait_until_serving(120)
        try:
            engines, unavailable = build_engines(
                model, model_dir, names, server.address if server else None, progress
            )
            for name, reason in unavailable.items():
                progress(f"skipping {name}: {reason}")
            peak = matmul_peak_gflops()
            threads = torch.get_num_threads()
            progress(f"matmul peak (fp32 2048^2): {peak:.0f} GFLOP/s, {threads} threads")
            rows = sweep(model, engines, seq_lens, batch_sizes, peak, quick)
        finally:
            if server:
                server.process.terminate()
                server.process.wait(30)
    write_outputs(out, rows, batch_sizes, environment(peak), unavailable)
    print((out / "latency.md").read_text())
    return rows
