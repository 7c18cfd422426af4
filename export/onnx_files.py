"""Saving an ONNX graph: one file, or the graph plus its weights as external data past 2 GB.

A protobuf message cannot exceed 2 GB, so the graph of a model with more than about
half a billion float32 parameters cannot be one file. Past EXTERNAL_DATA_BYTES of
weights the graph keeps its structure and `<name>.data` beside it holds the tensors;
ONNX Runtime and onnx.load find that file by the graph's own path.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx.external_data_helper import uses_external_data

# Below protobuf's 2 GiB limit with room for the graph's structure.
EXTERNAL_DATA_BYTES = 2**31 - 2**27


def weight_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the graph's initializers (where they are held in the proto itself)."""
    total = 0
    for tensor in model.graph.initializer:
        if not uses_external_data(tensor):
            total += len(tensor.raw_data) or tensor.ByteSize()
    return total


def save_checked(model: onnx.ModelProto, path: str | Path) -> Path:
    """Write `model` to `path` (external data past EXTERNAL_DATA_BYTES), then check the
    written file with onnx's full checker, which reads external data by the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    external = weight_bytes(model) > EXTERNAL_DATA_BYTES
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)  # save_model appends to an existing data file
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        location=data.name,
        size_threshold=1024,
    )
    onnx.checker.check_model(str(path), full_check=True)
    return path
