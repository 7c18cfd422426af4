"""python -m bench latency --out DIR [--max-seq-len N] [--quick]"""

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
    args = parser.parse_args(argv)

    from bench.latency import run_latency  # torch import deferred past --help

    run_latency(args.out, ModelConfig(), args.max_seq_len, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
