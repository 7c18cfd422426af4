"""Issue 12's transport study: where a short Encode's time goes outside the model.

    python research/transport-overhead/run.py grpc --out DIR [--model DIR] [--max-seq-len 512]
    python research/transport-overhead/run.py before-after --out DIR [--ref COMMIT]
    python research/transport-overhead/run.py profile --out DIR [--model DIR] [--tokens 8]

Each writes NAME.json and NAME.md (and its plots) under --out. See README.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from before_after import ISSUE_12_BASE, run_before_after
from flame_graphs import run_profile
from grpc_e2e import run_grpc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    grpc = commands.add_parser("grpc", help="Encode vs the runtime, echo floors, legs, pauses")
    before = commands.add_parser("before-after", help="this checkout's server vs an earlier one")
    profile = commands.add_parser("profile", help="py-spy flame graphs of server and client")
    for command in (grpc, before, profile):
        command.add_argument("--out", type=Path, required=True)
    for command in (grpc, profile):
        command.add_argument("--model", type=Path, help="model directory (default: seed 0)")
    for command in (grpc, before):
        command.add_argument("--max-seq-len", type=int, default=512 if command is grpc else 128)
        command.add_argument("--quick", action="store_true", help="few repeats (smoke)")
    before.add_argument("--ref", default=ISSUE_12_BASE, help="the earlier commit")
    profile.add_argument("--tokens", type=int, default=8)
    profile.add_argument("--seconds", type=int, default=5)
    args = parser.parse_args()
    if args.command == "grpc":
        run_grpc(args.out, args.model, args.max_seq_len, args.quick)
    elif args.command == "before-after":
        try:
            run_before_after(args.out, args.ref, args.max_seq_len, args.quick)
        except RuntimeError as exc:  # no such commit, or its code failed to export or serve
            print(f"before-after: {exc}", file=sys.stderr)
            return 1
    else:
        run_profile(args.out, args.model, args.tokens, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
