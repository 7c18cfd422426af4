"""Regenerate the Python code of protos/attnserve/v1/*.proto (`make proto`).

    python protos/generate.py [--out DIR]

grpcio-tools' bundled protoc writes *_pb2.py, *_pb2.pyi and *_pb2_grpc.py next
to each .proto (or under --out, which the drift test uses to compare).

The Open Inference Protocol's file (attnserve/oip) is then moved out of protobuf's default
descriptor pool into a pool of its own: tritonclient and KServe define the same
`inference.*` messages in the default pool, and two definitions of one name there are a
TypeError at import. Messages of either pool have the same wire format, so attnserve's
and tritonclient's clients and servers talk to each other, in one process or not.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
PRIVATE_POOL_FILES = ("attnserve/oip/grpc_service_pb2.py",)
DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("
PRIVATE_POOL = "_descriptor_pool.DescriptorPool().AddSerializedFile("


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
    for name in PRIVATE_POOL_FILES:
        path = out / name
        code = path.read_text()
        if code.count(DEFAULT_POOL) != 1:
            raise RuntimeError(f"{path}: expected one {DEFAULT_POOL!r} to replace")
        path.write_text(code.replace(DEFAULT_POOL, PRIVATE_POOL))
    return sorted(p for p in out.glob("attnserve/**/*_pb2*.py*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROTO_ROOT, help="output root")
    for path in generate(parser.parse_args().out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
