"""Saving an ONNX graph whose weights already live in the directory's weights file.

Every large tensor of a graph is a reference into the weights file by the time it is
saved (export/weights.py), so the graph itself is its structure and a few small
constants, far below protobuf's 2 GB limit, however large the model.
"""

from __future__ import annotations

from pathlib import Path

import onnx


def save_checked(model: onnx.ModelProto, path: str | Path) -> Path:
    """Write `model` to `path`, then check the written file with onnx's full checker, which
    finds the external data by the file's own path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    onnx.checker.check_model(str(path), full_check=True)
    return path
