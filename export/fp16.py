"""A float32 ONNX graph converted to float16 inside, float32 at its inputs and outputs.

For the CUDA execution provider (precision="fp16"): half the weight bytes and tensor-core
arithmetic, while clients keep sending and receiving float32. The conversion is
onnxruntime's own tool; the graph's metadata (the model config) is kept.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnxruntime.transformers.float16 import convert_float_to_float16

from attnserve.export.onnx_files import save_checked


def convert_to_fp16(src: str | Path, dst: str | Path) -> Path:
    """Write `src` converted to float16 (float32 inputs and outputs kept) to `dst`, checked."""
    model = onnx.load(str(src))
    fp16 = convert_float_to_float16(model, keep_io_types=True)
    return save_checked(fp16, dst)
