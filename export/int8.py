"""A float32 graph with 8-bit weights: MatMulNBits (com.microsoft), int8 arithmetic.

For models that do not fit in float32 (`--precision int8`): each MatMul whose weight is
in the weights file becomes ONNX Runtime's MatMulNBits with that weight quantized in
blocks along its input axis (symmetric int8 and a float32 scale per block of
BLOCK_SIZE), `accuracy_level` 4 (int8 activations). Everything else (the token table,
norms, biases) stays float32. Of what ONNX Runtime 1.31 offers on this CPU it is the one
that keeps a 0.5B model's attention within 0.02 and its embeddings at cosine >= 0.99; it
saves memory, not time (research/int8-on-cpu measures it against 4 bits and dynamic int8).
The quantization itself is onnxruntime's own (its C++ block quantizer); it runs one weight
at a time, read from the float32 weights file, so the conversion holds one tensor of
float32 at a time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnxruntime.quantization.matmul_nbits_quantizer import (
    DefaultWeightOnlyQuantConfig,
    DefaultWeightOnlyQuantizer,
)

from attnserve.export.onnx_files import save_checked
from attnserve.export.weights import WeightsFile, externalize

BITS = 8
# Weights per scale along K: 32 keeps attention within 0.011 where 128 gives 0.019, at the
# same speed (research/int8-on-cpu).
BLOCK_SIZE = 32
ACCURACY_LEVEL = 4  # int8 activations x int8 weights


def convert_to_int8(src: str | Path, dst: str | Path, weights: WeightsFile) -> Path:
    """Write `src` with its matrix weights in 8 bits to `dst`, every weight (quantized or
    not) into `weights`, checked."""
    src = Path(src)
    graph = ir.from_proto(onnx.load(str(src), load_external_data=False))
    quantizer = DefaultWeightOnlyQuantizer(
        DefaultWeightOnlyQuantConfig(
            block_size=BLOCK_SIZE, is_symmetric=True, accuracy_level=ACCURACY_LEVEL, bits=BITS
        )
    )
    for node in list(graph.graph):
        b = node.inputs[1] if node.op_type == "MatMul" and len(node.inputs) == 2 else None
        if b is None or not b.is_initializer() or b.const_value is None:
            continue
        if len(b.const_value.shape) != 2:
            continue
        k, n = b.const_value.shape.numpy()
        name = str(b.name)
        names = (f"{name}_Q{BITS}", f"{name}_scales")
        if names[0] not in weights:  # another graph of the directory quantized it already
            # (N, K / block, block) int8 as uint8, and (N, K / block) float32 scales
            packed, scales, _ = quantizer.qbits_block_quant(_read(b.const_value, src.parent))
            weights.reference(ir.Tensor(packed, name=names[0]))
            weights.reference(ir.Tensor(scales.reshape(-1), name=names[1]))
        quantized = [_initializer(graph, weights[quantized_name]) for quantized_name in names]
        replacement = ir.node(
            "MatMulNBits",
            inputs=[node.inputs[0], *quantized],
            attributes={
                "K": int(k),
                "N": int(n),
                "bits": BITS,
                "block_size": BLOCK_SIZE,
                "accuracy_level": ACCURACY_LEVEL,
            },
            domain="com.microsoft",
            name=f"{node.name}_Q{BITS}",
        )
        graph.graph.insert_after(node, replacement)
        output_name = node.outputs[0].name
        node.outputs[0].replace_all_uses_with(replacement.outputs[0], replace_graph_outputs=True)
        graph.graph.remove(node, safe=True)
        replacement.outputs[0].name = output_name
        if not b.uses():
            graph.graph.initializers.pop(name)
    graph.opset_imports["com.microsoft"] = 1
    # The float32 weights left (token table, norms) move along, read one at a time when
    # written: one weights file per precision.
    for value in graph.graph.initializers.values():
        if isinstance(value.const_value, ir.ExternalTensor):
            value.const_value = _lazy(value.const_value, src.parent)
    externalize(graph, weights)
    return save_checked(ir.to_proto(graph), dst)


def _read(tensor: ir.TensorProtocol, directory: Path) -> np.ndarray:
    """An external tensor's values, read from its file alone (not the whole file mapped)."""
    assert isinstance(tensor, ir.ExternalTensor)
    count = int(np.prod(tensor.shape.numpy()))
    dtype = tensor.dtype.numpy()
    values = np.fromfile(directory / tensor.location, dtype, count, offset=tensor.offset or 0)
    return values.reshape(tensor.shape.numpy())


def _lazy(tensor: ir.ExternalTensor, directory: Path) -> ir.LazyTensor:
    def read() -> ir.Tensor:
        return ir.Tensor(_read(tensor, directory), name=tensor.name)

    return ir.LazyTensor(read, tensor.dtype, tensor.shape, name=tensor.name)


def _initializer(graph: ir.Model, tensor: ir.ExternalTensor) -> ir.Value:
    """The graph's initializer for `tensor` (a reference into the weights file), made once."""
    name = str(tensor.name)
    if name not in graph.graph.initializers:
        value = ir.Value(name=name, shape=tensor.shape, type=ir.TensorType(tensor.dtype))
        value.const_value = tensor
        graph.graph.register_initializer(value)
    return graph.graph.initializers[name]
