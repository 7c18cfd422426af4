"""`attnserve COMMAND ...`: the one command line of the project.

Each package registers its own subcommands; heavy imports (torch, ORT) happen
only inside the command that needs them, so `--help` is instant and the
service image, which has no torch, runs `attnserve serve` and `attnserve health`.
"""

from __future__ import annotations

import argparse
import os
import sys

from attnserve.bench import cli as bench_cli
from attnserve.client import cli as client_cli
from attnserve.export import cli as export_cli
from attnserve.export import sae_cli
from attnserve.model import cli as model_cli
from attnserve.service import cli as service_cli


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="attnserve",
        description="A causal self-attention encoder in ONNX Runtime, served over gRPC.",
    )
    commands = root.add_subparsers(dest="command", required=True, metavar="COMMAND")
    service_cli.add_commands(commands)  # serve
    export_cli.add_commands(commands)  # export
    sae_cli.add_commands(commands)  # sae add | list
    model_cli.add_commands(commands)  # train
    client_cli.add_commands(commands)  # info, encode, heatmap, health
    bench_cli.add_commands(commands)  # bench latency | endpoints | attention | load
    return root


# What a command killed by SIGPIPE exits with (128 + 13), as `git log | head` leaves git.
BROKEN_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:
        # The reader went away (`attnserve encode --json | head`): stop without a traceback.
        # Python's own advice: point stdout at devnull, or its flush at exit raises again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
