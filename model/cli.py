"""`attnserve train --out CKPT.safetensors [--minutes N]`: train the default model (torch)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "train",
        help="train the encoder as a next-byte language model (writes a checkpoint)",
        description="Train the encoder as a next-byte causal language model on Python's "
        "documentation; writes a float16 safetensors checkpoint, a report and a loss curve.",
    )
    parser.add_argument("--out", type=Path, required=True, help="checkpoint to write")
    # Defaults (None here) come from TrainConfig, which imports torch: `--help` stays instant.
    parser.add_argument("--steps", type=int, help="optimiser steps (3600)")
    parser.add_argument("--minutes", type=float, help="stop after this long, whatever the step")
    parser.add_argument("--tokens-per-step", type=int, help="tokens in each step's batch (1024)")
    parser.add_argument("--short-seq-len", type=int, help="the window of most steps (64)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.set_defaults(run=run_train)


def run_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm  # torch and the rest are imported here: `--help` stays instant

    from attnserve.model.train import TrainConfig, train

    given = {
        "steps": args.steps,
        "minutes": args.minutes,
        "tokens_per_step": args.tokens_per_step,
        "short_seq_len": args.short_seq_len,
        "seed": args.seed,
        "threads": args.threads,
    }
    config = TrainConfig(**{k: v for k, v in given.items() if v is not None})
    with tqdm(total=config.steps, desc="training", unit="step", file=sys.stderr) as bar:

        def progress(step: int, total: int, text: str) -> None:
            bar.update(step - bar.n)
            bar.set_postfix_str(text)

        report = train(args.out, config, progress=progress)
    print(
        f"wrote {args.out}: {report['steps']} steps in {report['seconds']:.0f} s, validation "
        f"{report['validation_bits_per_byte']:.3f} bits/byte "
        f"(unigram {report['unigram_bits_per_byte']:.3f})"
    )
    return 0
