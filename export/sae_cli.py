"""`attnserve sae add MODEL_DIR SOURCE [--name NAME] [--hook HOOK]` and
`attnserve sae list MODEL_DIR`: the sparse autoencoders a model directory serves
(export/sae.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

TRAIN_FLAGS = {"hook": str, "d_sae": int, "k": int, "steps": int, "batch": int, "seed": int}
TRANSCODER_FLAGS = {
    "d_transcoder": int,
    "l1": float,
    "steps": int,
    "batch": int,
    "positions": int,
    "seed": int,
}


def add_commands(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "sae",
        help="add sparse autoencoders to a model directory, or list them",
        description="Sparse autoencoders (SAELens', Gemma Scope's, Llama Scope's) served "
        "beside a model.",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = actions.add_parser(
        "add",
        help="check an SAE against the model and write its graph into MODEL_DIR/saes/NAME",
        description="Check an SAE (SAELens' directory: cfg.json + sae_weights.safetensors; "
        "Gemma Scope's params.npz, with --hook; Llama Scope's directory: hyperparams.json + "
        "checkpoints/final.safetensors) or a transcoder (SAELens' transcoder directories; "
        "circuit-tracer's transcoder set: config.yaml + layer_{i}.safetensors, each layer "
        "written as LAYER-NAME) against the model, then write its ONNX graph into "
        "MODEL_DIR/saes/NAME.",
    )
    add.add_argument("model_dir", type=Path, metavar="MODEL_DIR")
    add.add_argument(
        "source", type=Path, metavar="SOURCE", help="an SAE's directory, or a params.npz"
    )
    add.add_argument("--name", help="the SAE's name in the model directory (default: SOURCE's)")
    add.add_argument(
        "--hook", help="the site it reads, e.g. blocks.3.hook_resid_post (default: its cfg's)"
    )
    add.add_argument(
        "--precision",
        choices=["fp32", "int8"],
        default="fp32",
        help="int8: its matrices in 8 bits, a quarter of the memory (wide SAEs)",
    )
    add.set_defaults(run=run_add)
    train = actions.add_parser(
        "train",
        help="train a TopK SAE on a model's own activations (what made the default SAE)",
        description="Train a TopK SAE on a checkpoint's activations at one site, over the "
        "corpus the default model was trained on, and write it in SAELens' format (cfg.json, "
        "sae_weights.safetensors, report.json) to OUT. Deterministic from --seed. Unset, "
        "each flag is the default SAE's (model/sae_train.py: blocks.2.hook_resid_pre, 2048 "
        "features, k 32, 2000 steps of 4096 positions, seed 0).",
    )
    training_flags(train, "model/pretrained/default-sae for the default's", TRAIN_FLAGS)
    train.set_defaults(run=run_train)
    transcoders = actions.add_parser(
        "train-transcoders",
        help="train a transcoder per layer on a model's own MLPs (the default set)",
        description="Train a ReLU skip transcoder per layer from each layer's hook_resid_mid "
        "to its hook_mlp_out over the corpus the default model was trained on, and write "
        "them as circuit-tracer's set (config.yaml, layer_{i}.safetensors, report.json) to "
        "OUT, for attribution graphs. Deterministic from --seed. Unset, each flag is the "
        "default set's (model/transcoder_train.py: 512 features, 1500 steps of 4096 "
        "positions, l1 0.2, seed 0).",
    )
    training_flags(transcoders, "model/pretrained/default-transcoders", TRANSCODER_FLAGS)
    transcoders.set_defaults(run=run_train_transcoders)
    listing = actions.add_parser("list", help="the SAEs a model directory holds")
    listing.add_argument("model_dir", type=Path, metavar="MODEL_DIR")
    listing.set_defaults(run=run_list)


def training_flags(
    command: argparse.ArgumentParser, default_out: str, flags: dict[str, type]
) -> None:
    """A train command's --out, --checkpoint and its trainer's knobs (unset: the default's)."""
    command.add_argument("--out", type=Path, required=True, help=default_out)
    command.add_argument(
        "--checkpoint", type=Path, default=None, help="the model (default: the default model's)"
    )
    for name, kind in flags.items():
        command.add_argument(f"--{name.replace('_', '-')}", type=kind)


def run_add(args: argparse.Namespace) -> int:
    from attnserve.export.sae import SAEError, add_sae
    from attnserve.export.sae_sources import CIRCUIT_TRACER_CONFIG
    from attnserve.export.scratch import ExportWriteError
    from attnserve.export.transcoder_set import add_transcoder_set

    try:
        if (args.source / CIRCUIT_TRACER_CONFIG).is_file():  # a set: one per layer
            if args.hook:
                raise SAEError("--hook: a transcoder set names its sites in its config.yaml")
            add_transcoder_set(args.model_dir, args.source, args.name, precision=args.precision)
        else:
            add_sae(
                args.model_dir,
                args.source,
                name=args.name,
                hook=args.hook,
                precision=args.precision,
            )
    except SAEError as exc:
        print(f"error: {exc}; nothing was written", file=sys.stderr)
        return 1
    except ExportWriteError as exc:  # a full disk: the message says so
        print(f"error: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


def run_train(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from attnserve.export.cli import DEFAULT_CHECKPOINT
    from attnserve.model.checkpoint import load_checkpoint
    from attnserve.model.sae_train import SAETrainConfig, train_sae

    given = {name: v for name in TRAIN_FLAGS if (v := getattr(args, name)) is not None}
    config = replace(SAETrainConfig(), **given)
    model = load_checkpoint(args.checkpoint or DEFAULT_CHECKPOINT)
    try:
        train_sae(model, args.out, config, log=lambda line: print(line, flush=True))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def run_train_transcoders(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from attnserve.export.cli import DEFAULT_CHECKPOINT
    from attnserve.model.checkpoint import load_checkpoint
    from attnserve.model.transcoder_train import TranscoderTrainConfig, train_transcoders

    given = {name: v for name in TRANSCODER_FLAGS if (v := getattr(args, name)) is not None}
    config = replace(TranscoderTrainConfig(), **given)
    model = load_checkpoint(args.checkpoint or DEFAULT_CHECKPOINT)
    train_transcoders(model, args.out, config, log=lambda line: print(line, flush=True))
    return 0


def run_list(args: argparse.Namespace) -> int:
    from attnserve.export.sae import list_saes

    for sae in list_saes(args.model_dir):
        config = sae["config"]
        print(
            f"{sae['name']}: {config['architecture']}, {config['d_sae']} features on "
            f"{config['hook_name']} (d_in {config['d_in']})"
        )
    return 0
