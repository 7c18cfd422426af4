"""A float32 ONNX graph converted to float16 inside, float32 at its inputs and outputs.

For the CUDA execution provider (`--precision fp16`): half the weight bytes and
tensor-core arithmetic, while clients keep sending and receiving float32. The
conversion is onnxruntime's own tool; the graph's metadata (the model config) is kept,
and the float16 weights go to the directory's float16 weights file, once for all graphs.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx_ir as ir
from onnxruntime.transformers.float16 import convert_float_to_float16

from attnserve.export.onnx_files import save_checked
from attnserve.export.weights import WeightsFile, externalize


def convert_to_fp16(src: str | Path, dst: str | Path, weights: WeightsFile) -> Path:
    """Write `src` converted to float16 (float32 inputs and outputs kept) to `dst`, its
    weights into `weights`, checked. Holds the float32 graph's weights while converting."""
    fp16 = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    graph = ir.from_proto(fp16)
    graph.graph.sort()  # the tool appends the casts of float inputs (head_mask) at the end
    externalize(graph, weights)
    return save_checked(ir.to_proto(graph), dst)
