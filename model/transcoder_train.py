"""Train a transcoder per layer on a model's own MLPs: `attnserve sae train-transcoders`,
what made model/pretrained/default-transcoders (the set `make serve` serves beside the
default model, for attribution graphs).

Each layer's MLP is replaced by a sparse, wider, linear-in-its-features map from what the
MLP reads to what it writes (Dunefsky et al. 2024, "Transcoders find interpretable LLM
feature circuits"; with a skip connection, Paulo et al. 2025):

    acts = relu(x @ W_enc.T + b_enc)                          # (N, S)
    y_hat = acts @ W_dec + b_dec + x @ W_skip.T                 # (N, D)
    loss = |y - y_hat|^2 / |y - mean y|^2 + l1 * sum_f acts_f |W_dec_f| / D

x is the layer's hook_resid_mid and y its hook_mlp_out, at every position of the training
corpus's windows but the first (model/sae_train.py's data). Written in circuit-tracer's
format (config.yaml, layer_{i}.safetensors: W_enc and W_dec (S, D), b_enc, b_dec, W_skip;
no threshold: a ReLU), which circuit-tracer and `attnserve sae add` read unchanged.
Deterministic from the seed on one machine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from attnserve.model.encoder import Encoder
from attnserve.model.hook_points import captured
from attnserve.model.hooks import MLP_OUT, RESID_MID
from attnserve.model.train import Corpus

INPUT_HOOK, OUTPUT_HOOK = "hook_resid_mid", "hook_mlp_out"  # circuit-tracer's names


@dataclass(frozen=True)
class TranscoderTrainConfig:
    d_transcoder: int = 512  # features per layer: 2 per dimension of the default's 256
    l1: float = 0.2  # the sparsity penalty's weight
    window: int = 128  # tokens per window the model runs on
    positions: int = 200_000  # training (and validation) positions per layer, at most
    steps: int = 1500
    batch: int = 4096  # positions per step
    lr: float = 1e-3
    seed: int = 0
    threads: int = 0  # torch intra-op threads; 0: torch's default
    scan: str = "attnserve-default-plt"  # the set's name in its graphs' metadata


class SkipTranscoder(torch.nn.Module):
    def __init__(self, d: int, s: int, mean_out: torch.Tensor) -> None:
        super().__init__()
        W_dec = torch.randn(s, d)
        self.W_dec = torch.nn.Parameter(W_dec / W_dec.norm(dim=1, keepdim=True))
        self.W_enc = torch.nn.Parameter(torch.randn(s, d) / d**0.5)
        self.b_enc = torch.nn.Parameter(torch.zeros(s))
        self.b_dec = torch.nn.Parameter(mean_out.clone())
        self.W_skip = torch.nn.Parameter(torch.zeros(d, d))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (acts (N, S), the reconstruction (N, D))."""
        acts = torch.relu(x @ self.W_enc.T + self.b_enc)
        return acts, acts @ self.W_dec + self.b_dec + x @ self.W_skip.T


def mlp_sites(
    model: Encoder, data: np.ndarray, window: int, limit: int, generator: torch.Generator
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (hook_resid_mid, hook_mlp_out), (N, D) each, over `data` in windows
    (each window's first position left out), `limit` random positions at most."""
    rows = len(data) // window
    ids = torch.from_numpy(data[: rows * window].astype(np.int64).reshape(rows, window))
    L = model.config.n_layers
    sites = [s.format(layer=i) for i in range(L) for s in (RESID_MID, MLP_OUT)]
    found: dict[str, list[torch.Tensor]] = {name: [] for name in sites}
    with torch.no_grad(), captured(model, sites) as values:
        for batch in ids.split(64):
            model(batch, need_weights=False)
            for name in sites:
                found[name].append(values[name][:, 1:].reshape(-1, values[name].shape[-1]))
    total = sum(len(part) for part in found[sites[0]])
    keep = torch.randperm(total, generator=generator)[:limit]
    stacked = [torch.cat(found[name])[keep].float() for name in sites]
    return [(stacked[2 * i], stacked[2 * i + 1]) for i in range(L)]


def train_transcoders(
    model: Encoder, out: Path, config: TranscoderTrainConfig, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Train one transcoder per layer of `model` and write circuit-tracer's set at `out`
    (config.yaml, layer_{i}.safetensors) with report.json beside them; -> the report."""
    if config.threads:
        torch.set_num_threads(config.threads)
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    model = model.eval()
    started = time.monotonic()
    corpus = Corpus.load(model.config)
    train = mlp_sites(model, corpus.train, config.window, config.positions, generator)
    valid = mlp_sites(model, corpus.validation, config.window, config.positions, generator)
    out.mkdir(parents=True, exist_ok=True)
    layers = []
    for layer, (x, y) in enumerate(train):
        transcoder = _fit(x, y, config, log, f"layer {layer}: ")
        layers.append(_measured(transcoder, *valid[layer]))
        tensors = {n: p.detach().half().contiguous() for n, p in transcoder.named_parameters()}
        save_file(tensors, str(out / f"layer_{layer}.safetensors"))
        log(
            f"layer {layer}: explains {layers[-1]['explained_variance']:.3f} of the MLP's "
            f"output, L0 {layers[-1]['l0']:.1f}"
        )
    cfg = {
        "model_kind": "transcoder_set",
        "feature_input_hook": INPUT_HOOK,
        "feature_output_hook": OUTPUT_HOOK,
        "scan": config.scan,
    }
    (out / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in cfg.items()))
    report = {
        "corpus": "the default model's training corpus (model/train.py), its validation topics",
        "layers": layers,
        "seconds": round(time.monotonic() - started, 1),
        "train_config": asdict(config),
        "torch": torch.__version__,
    }
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"wrote {out}: {len(layers)} transcoders of {config.d_transcoder} features")
    return report


def _fit(
    x: torch.Tensor,
    y: torch.Tensor,
    c: TranscoderTrainConfig,
    log: Callable[[str], None],
    prefix: str,
) -> SkipTranscoder:
    transcoder = SkipTranscoder(x.shape[1], c.d_transcoder, y.mean(0))
    optimizer = torch.optim.Adam(transcoder.parameters(), lr=c.lr)
    variance = (y - y.mean(0)).pow(2).sum(-1).mean()
    for step in range(1, c.steps + 1):
        start = (step - 1) * c.batch % max(1, len(x) - c.batch)
        xb, yb = x[start : start + c.batch], y[start : start + c.batch]
        acts, y_hat = transcoder(xb)
        error = (yb - y_hat).pow(2).sum(-1).mean() / variance
        sparsity = (acts * transcoder.W_dec.norm(dim=1)).sum(-1).mean() / x.shape[1]
        loss = error + c.l1 * sparsity
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        lr = c.lr * min(1.0, (c.steps - step) / (0.2 * c.steps) + 1e-3)
        for group in optimizer.param_groups:  # constant, then to 0 over the last fifth
            group["lr"] = lr
        optimizer.step()
        if step % 500 == 0 or step == c.steps:
            l0 = float((acts > 0).float().sum(-1).mean())
            log(f"{prefix}step {step}/{c.steps}: error {error.item():.4f}, L0 {l0:.1f}")
    return transcoder


@torch.no_grad()
def _measured(transcoder: SkipTranscoder, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    acts, y_hat = transcoder(x)
    explained = 1 - (y - y_hat).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
    return {
        "explained_variance": round(float(explained), 4),
        "l0": round(float((acts > 0).float().sum(-1).mean()), 2),
        "dead_features": int(((acts > 0).sum(0) == 0).sum()),
    }
