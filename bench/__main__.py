"""python -m bench {latency,grpc} --out DIR [...]: attnserve's benchmarks."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from model.config import ModelConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description="attnserve benchmarks")
    commands = parser.add_subparsers(dest="command", required=True)
    latency = commands.add_parser(
        "latency", help="PyTorch eager vs ONNX Runtime CPU latency across sequence lengths"
    )
    latency.add_argument("--out", type=Path, required=True, help="directory for JSON and markdown")
    latency.add_argument(
        "--max-seq-len", type=int, help="longest length to sweep (default: model's)"
    )
    latency.add_argument("--quick", action="store_true", help="few repeats, for smoke tests")

    grpc = commands.add_parser(
        "grpc", help="gRPC Encode vs the runtime alone; attention bytes and time on the wire"
    )
    grpc.add_argument("--out", type=Path, required=True, help="directory for JSON and markdown")
    grpc.add_argument("--model", type=Path, help="model directory (default: export seed 0)")
    grpc.add_argument("--max-seq-len", type=int, default=512, help="longest length (512)")
    grpc.add_argument("--quick", action="store_true", help="few repeats, for smoke tests")
    args = parser.parse_args(argv)

    if args.command == "latency":
        from bench.latency import run_latency  # torch import deferred past --help

        run_latency(args.out, ModelConfig(), args.max_seq_len, args.quick)
    else:
        from bench.grpc_e2e import run_grpc

        run_grpc(args.out, args.model, args.max_seq_len, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
