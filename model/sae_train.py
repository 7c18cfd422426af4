"""Train a sparse autoencoder on a model's own activations: `attnserve sae train`, what made
model/pretrained/default-sae (the SAE `make serve` serves beside the default model).

A TopK SAE (Gao et al. 2024, "Scaling and evaluating sparse autoencoders"; SAELens'
`TopKSAE`, so SAELens and `attnserve sae add` read it unchanged):

    pre = (x - b_dec) @ W_enc + b_enc              # (N, S)
    acts = relu of the k largest of pre, 0 elsewhere
    x_hat = acts @ W_dec + b_dec                   # (N, D)
    loss = |x - x_hat|^2 + aux_coef * |e - e_hat|^2    (both over |x - mean x|^2)

where e = x - x_hat is rebuilt from the k_aux largest pre-activations of the features that
have not fired for `dead_after` steps (the paper's AuxK: it brings dead features back).
W_dec's rows are kept at unit norm, so a feature's activation is its size along its
direction. b_dec starts at the data's mean, W_enc at W_dec's transpose.

The data: the model's activations at the hook on the training corpus's text (the model's
own, model/train.py's Corpus) in windows of `window` tokens, every position but the first
(its <bos> position is an outlier of the residual stream that no feature should spend
itself on), shuffled; the validation topics measure what the SAE explains. Deterministic
from the seed on one machine.
"""

from __future__ import annotations

import json
import math
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
from attnserve.model.hooks import hook_names, site_width
from attnserve.model.train import Corpus


@dataclass(frozen=True)
class SAETrainConfig:
    hook: str = "blocks.2.hook_resid_pre"  # the middle of the default model's four layers
    d_sae: int = 2048  # features: 8 per dimension of its 256
    k: int = 32  # features active per position
    window: int = 128  # tokens per window the model runs on
    steps: int = 2000
    batch: int = 4096  # positions per step
    lr: float = 4e-4
    aux_coef: float = 1 / 32
    dead_after: int = 200  # steps without firing that make a feature dead (AuxK)
    seed: int = 0
    threads: int = 0  # torch intra-op threads; 0: torch's default


def activations(model: Encoder, data: np.ndarray, hook: str, window: int) -> torch.Tensor:
    """The model's values at `hook` (N, D) over `data` in windows, each window's first
    position left out."""
    rows = len(data) // window
    ids = torch.from_numpy(data[: rows * window].astype(np.int64).reshape(rows, window))
    out = []
    with torch.no_grad(), captured(model, [hook]) as values:
        for batch in ids.split(64):
            model(batch, need_weights=False)
            out.append(values[hook][:, 1:].reshape(-1, values[hook].shape[-1]).float())
    return torch.cat(out)


class TopKSAE(torch.nn.Module):
    def __init__(self, d_in: int, d_sae: int, k: int, mean: torch.Tensor) -> None:
        super().__init__()
        self.k = k
        W_dec = torch.randn(d_sae, d_in)
        self.W_dec = torch.nn.Parameter(W_dec / W_dec.norm(dim=1, keepdim=True))
        self.W_enc = torch.nn.Parameter(self.W_dec.detach().T.clone())
        self.b_enc = torch.nn.Parameter(torch.zeros(d_sae))
        self.b_dec = torch.nn.Parameter(mean.clone())

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.b_dec) @ self.W_enc + self.b_enc  # (N, S)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return _top(self.pre(x), self.k)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (acts, the reconstruction, the pre-activations)."""
        pre = self.pre(x)
        acts = _top(pre, self.k)
        return acts, acts @ self.W_dec + self.b_dec, pre

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        self.W_dec.data /= self.W_dec.data.norm(dim=1, keepdim=True)


def _top(pre: torch.Tensor, k: int) -> torch.Tensor:
    """relu of the k largest of each row, 0 elsewhere."""
    values, indices = pre.topk(k, dim=-1)
    return torch.zeros_like(pre).scatter_(-1, indices, values.relu())


def train_sae(
    model: Encoder, out: Path, config: SAETrainConfig, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Train on `model`'s activations and write SAELens' directory at `out` (cfg.json,
    sae_weights.safetensors) with report.json beside them; -> the report."""
    known = config.hook in hook_names(model.config)
    d_in = site_width(model.config, config.hook) if known else None
    if d_in is None:
        raise ValueError(f"hook: {config.hook!r} is not a site of the model with a width")
    if config.threads:
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    model = model.eval()
    started = time.monotonic()
    corpus = Corpus.load(model.config)
    train = activations(model, corpus.train, config.hook, config.window)
    valid = activations(model, corpus.validation, config.hook, config.window)
    train = train[torch.randperm(len(train))]
    log(f"{len(train):,} training and {len(valid):,} validation positions of {config.hook}")
    sae = TopKSAE(d_in, config.d_sae, config.k, train.mean(0))
    optimizer = torch.optim.Adam(sae.parameters(), lr=config.lr)
    variance = (train - train.mean(0)).pow(2).sum(-1).mean()
    last_fired = torch.zeros(config.d_sae, dtype=torch.long)
    k_aux = d_in // 2
    for step in range(1, config.steps + 1):
        start = (step - 1) * config.batch % (len(train) - config.batch)
        x = train[start : start + config.batch]
        acts, x_hat, pre = sae(x)
        error = x - x_hat
        loss = error.pow(2).sum(-1).mean() / variance
        fired = (acts > 0).any(0)
        last_fired[fired] = step
        dead = step - last_fired > config.dead_after
        if dead.any():  # AuxK: the dead features' largest pre-activations rebuild the error
            dead_pre = pre.masked_fill(~dead, -math.inf)
            aux = _top(dead_pre, min(k_aux, int(dead.sum())))
            aux_error = error.detach() - aux @ sae.W_dec
            loss = loss + config.aux_coef * aux_error.pow(2).sum(-1).mean() / variance
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        lr = config.lr * min(1.0, (config.steps - step) / (0.2 * config.steps) + 1e-3)
        for group in optimizer.param_groups:  # constant, then to 0 over the last fifth
            group["lr"] = lr
        optimizer.step()
        sae.normalize_decoder()
        if step % 250 == 0 or step == config.steps:
            log(
                f"step {step}/{config.steps}: loss {loss.item():.4f}, dead "
                f"{int(dead.sum())}/{config.d_sae}, {time.monotonic() - started:.0f} s"
            )
    report = _report(sae, valid, last_fired, config, time.monotonic() - started)
    _save(sae, out, config, d_in, report)
    log(
        f"wrote {out}: explains {report['validation_explained_variance']:.3f} of the "
        f"variance, L0 {config.k}, {report['dead_features']} dead features"
    )
    return report


@torch.no_grad()
def _report(
    sae: TopKSAE, valid: torch.Tensor, last_fired: torch.Tensor, c: SAETrainConfig, seconds: float
) -> dict[str, Any]:
    _, x_hat, _ = sae(valid)
    explained = 1 - (valid - x_hat).pow(2).sum() / (valid - valid.mean(0)).pow(2).sum()
    fired = (sae.encode(valid) > 0).float().mean(0)  # each feature's firing rate
    return {
        "corpus": "the default model's training corpus (model/train.py), its validation topics",
        "validation_positions": len(valid),
        "validation_explained_variance": round(float(explained), 4),
        "dead_features": int((c.steps - last_fired > c.dead_after).sum()),
        "features_never_firing_on_validation": int((fired == 0).sum()),
        "seconds": round(seconds, 1),
        "train_config": asdict(c),
        "torch": torch.__version__,
    }


def _save(sae: TopKSAE, out: Path, c: SAETrainConfig, d_in: int, report: dict[str, Any]) -> None:
    """SAELens' layout (SAE.save_model): cfg.json and sae_weights.safetensors (float16:
    small enough to commit; served in float32)."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architecture": "topk",
        "d_in": d_in,
        "d_sae": c.d_sae,
        "k": c.k,
        "dtype": "float32",
        "device": "cpu",
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "rescale_acts_by_decoder_norm": False,
        "metadata": {"hook_name": c.hook, "model_name": "attnserve-encoder"},
    }
    (out / "cfg.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tensors = {name: p.detach().half().contiguous() for name, p in sae.named_parameters()}
    save_file(tensors, str(out / "sae_weights.safetensors"))
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
