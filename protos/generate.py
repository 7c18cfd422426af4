"""Regenerate the Python code of protos/attnserve/v1/*.proto (`make proto`).

    python protos/generate.py [--out DIR]

grpcio-tools' bundled protoc writes *_pb2.py, *_pb2.pyi and *_pb2_grpc.py next
to each .proto (or under --out, which the drift test uses to compare).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.glob("attnserve/**/*.proto"))


def generate(out: Path = PROTO_ROOT) -> list[Path]:
    """Run protoc; returns the generated files."""
    out.mkdir(parents=True, exist_ok=True)
    files = [str(p.relative_to(PROTO_ROOT)) for p in proto_files()]
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {files}")
    return sorted(p for p in out.glob("attnserve/**/*_pb2*.py*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_ROOT, help="output root")
    for path in generate(parser.parse_args().out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
