"""Latency across sequence lengths: PyTorch eager vs ONNX Runtime CPU, side by side.

Both engines run the same weights on the same inputs in one process. Calls are
interleaved (engine A, engine B, A, B, ...) so that noise on a shared machine
hits both alike, and the ratio of medians is what we report.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from export.model_dir import write_model_dir
from model.config import ModelConfig
from model.encoder import Encoder, build_encoder
from service.runtime import OrtRuntime, RuntimeOptions


@dataclass(frozen=True)
class Row:
    engine: str
    batch: int
    seq_len: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    gflops: float  # model FLOPs of one call / p50
    repeats: int


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
    best = min(_timed(torch.matmul, a, b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def _timed(fn: Callable[..., object], *args: object) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


Engine = Callable[[np.ndarray], object]

# engine -> the engine its ratio is taken against (same outputs, PyTorch eager)
BASELINES = {
    "torch-eager": "torch-eager",
    "ort-cpu": "torch-eager",
    "ort-cpu-spin": "torch-eager",
    "torch-eager-emb": "torch-eager-emb",
    "ort-cpu-emb": "torch-eager-emb",
    "matmul-only": "matmul-only",
}


def matmul_only(config: ModelConfig) -> Engine:
    """Only the model's matrix products, at its shapes, in torch: the floor under any
    engine built on the same kind of GEMM kernels (everything else is overhead)."""
    operands: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def run(ids: np.ndarray) -> object:
        batch, t = ids.shape
        d, h = config.d_model, config.n_heads
        if (batch, t) not in operands:
            operands[(batch, t)] = [
                (torch.randn(batch * t, d), torch.randn(d, 3 * d)),  # fused Q, K, V
                (torch.randn(batch, h, t, d // h), torch.randn(batch, h, d // h, t)),  # Q K^T
                (torch.randn(batch, h, t, t), torch.randn(batch, h, t, d // h)),  # A V
                (torch.randn(batch * t, d), torch.randn(d, d)),  # output projection
                (torch.randn(batch * t, d), torch.randn(d, config.d_ff)),  # MLP in
                (torch.randn(batch * t, config.d_ff), torch.randn(config.d_ff, d)),  # MLP out
            ]
        with torch.inference_mode():
            for _ in range(config.n_layers):
                for a, b in operands[(batch, t)]:
                    a @ b
        return None

    return run


def engines_for(model: Encoder, model_dir: Path) -> dict[str, Engine]:
    """The engines compared, each a function of input_ids.

    "-emb" engines return embeddings only: PyTorch through its fused
    scaled_dot_product_attention, ORT through the embeddings-only graph.
    """

    def torch_eager(ids: np.ndarray, need_weights: bool = True) -> object:
        with torch.inference_mode():
            return model(torch.from_numpy(ids), need_weights=need_weights)

    ort_default = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    ort_spinning = OrtRuntime(model_dir, RuntimeOptions(provider="cpu", intra_op_spinning=True))
    return {
        "torch-eager": torch_eager,
        "ort-cpu": ort_default.run,
        "ort-cpu-spin": ort_spinning.run,
        "torch-eager-emb": lambda ids: torch_eager(ids, need_weights=False),
        "ort-cpu-emb": ort_default.embed,
        "matmul-only": matmul_only(model.config),
    }


def repeats_for(seq_len: int, quick: bool) -> int:
    """Fewer repeats where one call is long, so a sweep stays around a minute."""
    if quick:
        return 3
    return 30 if seq_len <= 128 else 15 if seq_len <= 512 else 6


ROUNDS = 3


def sweep(
    model: Encoder,
    engines: dict[str, Engine],
    seq_lens: list[int],
    batch: int = 1,
    quick: bool = False,
    log: Callable[[str], None] = print,
) -> list[Row]:
    """Time every engine at every length, in alternating blocks.

    Each engine runs a block of calls, then the next engine does, for ROUNDS
    rounds: slow drifts of a shared machine hit every engine alike, and the
    first call of each block (untimed) absorbs the previous engine's threads
    still spinning down.
    """
    rng = np.random.default_rng(0)
    rows = []
    for seq_len in seq_lens:
        ids = rng.integers(0, model.config.vocab_size, size=(batch, seq_len), dtype=np.int64)
        repeats = repeats_for(seq_len, quick)
        times: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(ROUNDS):
            for name, run in engines.items():
                run(ids)  # untimed: warm-up
                times[name].extend(_timed(run, ids) * 1e3 for _ in range(repeats))
        flops = model_flops(model.config, batch, seq_len)
        for name, samples in times.items():
            p50, p90, p99 = np.percentile(samples, [50, 90, 99])
            rows.append(
                Row(
                    name,
                    batch,
                    seq_len,
                    round(p50, 4),
                    round(p90, 4),
                    round(p99, 4),
                    round(flops / (p50 / 1e3) / 1e9, 2),
                    len(samples),
                )
            )
        log(
            f"  seq_len {seq_len:>5}: "
            + "  ".join(f"{r.engine} {r.p50_ms:.2f} ms" for r in rows[-len(engines) :])
        )
    return rows


def markdown_table(rows: list[Row], peak: float) -> str:
    """One line per (batch, seq_len): each engine's p50, and its ratio to its baseline."""
    by_cell: dict[tuple[int, int], dict[str, Row]] = {}
    for r in rows:
        by_cell.setdefault((r.batch, r.seq_len), {})[r.engine] = r
    engines = list(dict.fromkeys(r.engine for r in rows))
    lines = [
        "| batch | seq len | " + " | ".join(engines) + " | ort-cpu GFLOP/s (% of peak) |",
        "|---|---|" + "---|" * (len(engines) + 1),
    ]
    for (batch, seq_len), cell in sorted(by_cell.items()):
        cells = []
        for name in engines:
            row, base = cell[name], cell[BASELINES[name]]
            ratio = "" if base is row else f" ({base.p50_ms / row.p50_ms:.1f}x)"
            cells.append(f"{row.p50_ms:.2f} ms{ratio}")
        ort = cell["ort-cpu"]
        lines.append(
            f"| {batch} | {seq_len} | "
            + " | ".join(cells)
            + f" | {ort.gflops:.0f} ({100 * ort.gflops / peak:.0f}%) |"
        )
    return "\n".join(lines)


def run_latency(
    out: Path, config: ModelConfig, max_seq_len: int | None, quick: bool, seed: int = 0
) -> list[Row]:
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    limit = min(max_seq_len or config.max_seq_len, config.max_seq_len)
    seq_lens = [t for t in (8, 16, 32, 64, 128, 256, 512, 1024) if t <= limit]
    model = build_encoder(config, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        write_model_dir(model, tmp, shapes=[(1, 1), (1, limit)], log=log)
        engines = engines_for(model, Path(tmp))
        peak = matmul_peak_gflops()
        log(f"matmul peak (fp32 2048^2): {peak:.0f} GFLOP/s, {torch.get_num_threads()} threads")
        rows = sweep(model, engines, seq_lens, quick=quick, log=log)
        peak = max(peak, matmul_peak_gflops())  # measured again after the sweep: the better one
    table = markdown_table(rows, peak)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latency.json").write_text(
        json.dumps(
            {"matmul_peak_gflops": round(peak, 1), "rows": [asdict(r) for r in rows]}, indent=2
        )
        + "\n"
    )
    (out / "latency.md").write_text(table + "\n")
    print(table)
    return rows
