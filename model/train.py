"""Train the encoder as a next-byte causal language model: `attnserve train`.

The served model is the encoder alone; training adds an output head tied to the
token embedding (logits = ln_f(x) @ tok_emb^T, as in GPT-2), so nothing is
learned that the served graph does not contain. Cross-entropy on the next
byte, AdamW, linear warm-up then a cosine decay; deterministic from the seed on
one machine.

The corpus is Python's own documentation as the interpreter ships it
(`pydoc_data.topics`: the language reference and library topics, ~466 KB of
English prose with code), under the PSF License: on every machine, nothing to
download. The last 10% of it (by topic) is held out for validation.
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
from torch import nn
from torch.nn import functional as F

from attnserve.model.checkpoint import save_checkpoint
from attnserve.model.config import ModelConfig
from attnserve.model.encoder import Encoder, build_encoder
from attnserve.model.tokenizer import ByteTokenizer

CORPUS = "pydoc_data.topics (Python's documentation topics), PSF License"


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 3600  # optimiser steps (training may stop earlier: `minutes`)
    minutes: float | None = None  # wall-clock budget; the schedule is laid out for `steps`
    tokens_per_step: int = 1024  # windows per step = tokens_per_step // window length
    short_seq_len: int = 64  # the window length of most steps
    seq_len: int = 1024  # the longest window (the model's max_seq_len)
    long_every: int = 4  # every n-th step takes a longer window; 0: short windows only
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 250
    eval_tokens: int = 16384  # validation tokens per evaluation, in windows of the step's length
    seed: int = 0
    threads: int = 0  # torch intra-op threads; 0: torch's default


@dataclass(frozen=True)
class Corpus:
    train: np.ndarray  # uint16 token ids (bytes, and <bos> between documents)
    validation: np.ndarray
    documents: int
    bytes: int

    @classmethod
    def load(cls, config: ModelConfig) -> Corpus:
        import pydoc_data.topics

        tokenizer = ByteTokenizer(config)
        topics = [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]
        cut = int(len(topics) * 0.9)

        def ids(docs: list[str]) -> np.ndarray:
            return np.array([i for d in docs for i in tokenizer.encode(d)], dtype=np.uint16)

        total = sum(len(t.encode()) for t in topics)
        return cls(ids(topics[:cut]), ids(topics[cut:]), len(topics), total)

    def unigram_bits_per_byte(self) -> float:
        """The entropy of the training bytes' own frequencies, measured on validation:
        what a model that ignores context at all would score."""
        counts = np.bincount(self.train, minlength=65536).astype(np.float64) + 1.0
        p = counts / counts.sum()
        return float(-np.log2(p[self.validation]).mean())


class LanguageModel(nn.Module):
    """The encoder plus a next-token head tied to its token embedding."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x, _ = self.encoder(input_ids, need_weights=False)  # (B, T, D)
        return x @ self.encoder.tok_emb.weight.T  # (B, T, vocab)


def windows(data: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, ...]:
    """Inputs and next-token targets for windows starting at `starts`."""
    rows = np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int64)
    batch = torch.from_numpy(rows)
    return batch[:, :-1], batch[:, 1:]


def window_length(step: int, c: TrainConfig) -> int:
    """`short_seq_len`, except every `long_every`-th step, which cycles through the doublings
    up to `seq_len` (128, 256, 512, 1024 with the defaults).

    Short windows are cheap (attention is quadratic) and teach most of what a byte model
    learns; but a learned positional embedding is trained only where windows reach, so the
    long ones are spread over the whole schedule, at the learning rates the short ones get.
    (Putting them all at the end, at the tail of the cosine, left positions past 64 worse
    than the first 64: 2.4-3.0 against 1.7 bits per byte.)"""
    doublings = max(0, math.ceil(math.log2(c.seq_len / c.short_seq_len)))
    if doublings == 0 or c.long_every == 0 or step % c.long_every != c.long_every - 1:
        return c.short_seq_len
    stage = 1 + (step // c.long_every) % doublings
    return min(c.seq_len, c.short_seq_len * 2**stage)


def learning_rate(step: int, c: TrainConfig) -> float:
    if step < c.warmup_steps:
        return c.lr * (step + 1) / c.warmup_steps
    progress = min(1.0, (step - c.warmup_steps) / max(1, c.steps - c.warmup_steps))
    return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def evaluate(model: LanguageModel, data: np.ndarray, seq_len: int, tokens: int) -> float:
    """Mean next-byte loss (nats) over evenly spaced validation windows of `seq_len`."""
    model.eval()
    count = max(1, tokens // seq_len)
    starts = np.linspace(0, len(data) - seq_len - 2, count).astype(np.int64)
    losses = []
    for chunk in np.array_split(starts, max(1, count * seq_len // 4096)):
        x, y = windows(data, chunk, seq_len)
        losses.append(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item())
    model.train()
    return float(np.mean(losses))


def train(
    out: Path,
    config: TrainConfig = TrainConfig(),
    model_config: ModelConfig = ModelConfig(),  # noqa: B008
    progress: Callable[[int, int, str], None] | None = None,
) -> dict[str, Any]:
    """Train, write `out` (float16 safetensors, config in its metadata) and, beside it,
    `<out>.report.json` and `<out>.loss.png`. Returns the report."""
    if config.threads:
        torch.set_num_threads(config.threads)
    corpus = Corpus.load(model_config)
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    model = LanguageModel(build_encoder(model_config, seed=config.seed).train())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=(0.9, 0.95),
    )
    curve: list[dict[str, Any]] = []
    start = time.monotonic()
    step = 0
    tokens_seen = 0
    for step in range(config.steps):
        if config.minutes is not None and time.monotonic() - start > 60 * config.minutes:
            break
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        seq_len = window_length(step, config)
        batch = max(1, config.tokens_per_step // seq_len)
        starts = rng.integers(0, len(corpus.train) - seq_len - 1, batch)
        x, y = windows(corpus.train, starts, seq_len)
        tokens_seen += x.numel()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        if step % config.eval_every == 0:
            curve.append(_point(model, corpus, config, step, seq_len, loss.item()))
        if progress:
            progress(step + 1, config.steps, f"T {seq_len} loss {loss.item():.3f}")
    steps_done = step + 1
    curve.append(_point(model, corpus, config, steps_done, seq_len, loss.item()))
    seconds = time.monotonic() - start

    encoder = model.encoder.eval()
    save_checkpoint(encoder, out, dtype=torch.float16)
    to_bits = 1 / math.log(2)
    report = {
        "corpus": CORPUS,
        "corpus_documents": corpus.documents,
        "corpus_bytes": corpus.bytes,
        "train_tokens": len(corpus.train),
        "validation_tokens": len(corpus.validation),
        "steps": steps_done,
        "tokens_seen": tokens_seen,
        "seconds": round(seconds, 1),
        # The headline: full-length windows, the longest context the model serves.
        "validation_bits_per_byte": round(curve[-1]["validation_loss"] * to_bits, 4),
        "validation_bits_per_byte_short": round(curve[-1]["validation_loss_short"] * to_bits, 4),
        "train_bits_per_byte_last": round(curve[-1]["train_loss"] * to_bits, 4),
        "unigram_bits_per_byte": round(corpus.unigram_bits_per_byte(), 4),
        "train_config": asdict(config),
        "model_config": model_config.to_dict(),
        "torch": torch.__version__,
        "curve": curve,
    }
    Path(f"{out}.report.json").write_text(json.dumps(report, indent=1) + "\n")
    _plot(curve, Path(f"{out}.loss.png"), report)
    return report


def _point(
    model: LanguageModel, corpus: Corpus, c: TrainConfig, step: int, seq_len: int, loss: float
) -> dict[str, Any]:
    """One point of the loss curve: this step's batch, and validation in windows of both
    lengths (the short ones show learning, the full ones what the longest context gets)."""
    return {
        "step": step,
        "seq_len": seq_len,
        "train_loss": loss,
        "validation_loss": evaluate(model, corpus.validation, c.seq_len, c.eval_tokens),
        "validation_loss_short": evaluate(model, corpus.validation, c.short_seq_len, c.eval_tokens),
    }


def _plot(curve: list[dict[str, Any]], path: Path, report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    to_bits = 1 / math.log(2)
    steps = [p["step"] for p in curve]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [p["train_loss"] * to_bits for p in curve], label="train (one batch)")
    short, full = report["train_config"]["short_seq_len"], report["train_config"]["seq_len"]
    for key, length in (("validation_loss_short", short), ("validation_loss", full)):
        label = f"validation, {length}-byte windows"
        ax.plot(steps, [p[key] * to_bits for p in curve], label=label)
    ax.axhline(report["unigram_bits_per_byte"], color="grey", ls="--", label="unigram entropy")
    ax.set_xlabel("step")
    ax.set_ylabel("bits per byte")
    ax.set_title("next-byte loss of the default model")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
