"""`attnserve sae add MODEL_DIR SOURCE [--name NAME] [--hook HOOK]` and
`attnserve sae list MODEL_DIR`: the sparse autoencoders a model directory serves
(export/sae.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


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
        "checkpoints/final.safetensors) against the model, then write its ONNX graph into "
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
    listing = actions.add_parser("list", help="the SAEs a model directory holds")
    listing.add_argument("model_dir", type=Path, metavar="MODEL_DIR")
    listing.set_defaults(run=run_list)


def run_add(args: argparse.Namespace) -> int:
    from attnserve.export.sae import SAEError, add_sae
    from attnserve.export.scratch import ExportWriteError

    try:
        add_sae(
            args.model_dir, args.source, name=args.name, hook=args.hook, precision=args.precision
        )
    except SAEError as exc:
        print(f"error: {exc}; nothing was written", file=sys.stderr)
        return 1
    except ExportWriteError as exc:  # a full disk: the message says so
        print(f"error: {exc.strerror}", file=sys.stderr)
        return 1
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
