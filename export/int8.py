"""A float32 graph with 8-bit weights: MatMulNBits (com.microsoft), int8 arithmetic.

For models that do not fit in float32 (`--precision int8`): each MatMul whose weight is
in the weights file becomes ONNX Runtime's MatMulNBits with that weight quantized in
blocks along its input axis (symmetric int8 and a float32 scale per block of
BLOCK_SIZE), `accuracy_level` 4 (int8 activations), and each Gather of a table's rows (the
token table) GatherBlockQuantized on the same blocks: a tied table is one set of 8-bit
bytes that both read. Norms and biases stay float32. Of what ONNX Runtime 1.31 offers on
this CPU it is the one that keeps a 0.5B model's attention within 0.02 and its embeddings
at cosine >= 0.99; it saves memory, not time (research/int8-on-cpu measures it against 4
bits and dynamic int8).
The quantization itself is onnxruntime's own (its C++ block quantizer); it runs one weight
at a time, read from the float32 weights file (a table a slice of rows at a time), so the
conversion holds one tensor of float32 at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnxruntime.quantization.matmul_nbits_quantizer import (
    DefaultWeightOnlyQuantConfig,
    DefaultWeightOnlyQuantizer,
)

from attnserve.export.onnx_files import save_checked
from attnserve.export.weights import TRANSPOSED_SUFFIX, WeightsFile, externalize

BITS = 8
# Weights per scale along K: 32 keeps attention within 0.011 where 128 gives 0.019, at the
# same speed (research/int8-on-cpu).
BLOCK_SIZE = 32
ACCURACY_LEVEL = 4  # int8 activations x int8 weights
# How much of a matrix is quantized at once: a token table of 256k rows is read in slices.
ROWS_AT_ONCE_BYTES = 64 << 20


def convert_to_int8(src: str | Path, dst: str | Path, weights: WeightsFile) -> Path:
    """Write `src` with its matrix weights in 8 bits to `dst`, every weight (quantized or
    not) into `weights`, checked: each MatMul on a weight becomes MatMulNBits, each Gather
    of a table's rows (the token table; an unembedding's rows for attribution) becomes
    GatherBlockQuantized, reading the same 8-bit bytes an unembedding's MatMulNBits reads
    where the table is tied."""
    src = Path(src)
    graph = ir.from_proto(onnx.load(str(src), load_external_data=False))
    quantizer = DefaultWeightOnlyQuantizer(
        DefaultWeightOnlyQuantConfig(
            block_size=BLOCK_SIZE, is_symmetric=True, accuracy_level=ACCURACY_LEVEL, bits=BITS
        )
    )
    for node in list(graph.graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        matmul = node.op_type == "MatMul" and _is_matrix(node.inputs[1])
        if matmul or (node.op_type == "Gemm" and _is_unembedding(node)):
            _to_matmul_nbits(graph, node, weights, quantizer, src.parent)
        elif node.op_type == "Gather" and _is_matrix(node.inputs[0]):
            axis = node.attributes.get_int("axis", 0)
            k = node.inputs[0].shape.numpy()[1]  # type: ignore[union-attr]
            if axis == 0 and k % BLOCK_SIZE == 0:
                _to_gather_block_quantized(graph, node, weights, quantizer, src.parent)
    graph.opset_imports["com.microsoft"] = 1
    # The float32 weights left (norms, biases) move along, read one at a time when
    # written: one weights file per precision.
    for value in graph.graph.initializers.values():
        if isinstance(value.const_value, ir.ExternalTensor):
            value.const_value = _lazy(value.const_value, src.parent)
    externalize(graph, weights)
    return save_checked(ir.to_proto(graph), dst)


def _is_matrix(value: ir.Value | None) -> bool:
    """A float32 initializer of two dimensions, in the weights file."""
    if value is None or not value.is_initializer() or value.const_value is None:
        return False
    tensor = value.const_value
    return len(tensor.shape) == 2 and tensor.dtype == ir.DataType.FLOAT


def _is_unembedding(node: ir.Node) -> bool:
    """A Gemm of rows by a table's transpose (x @ W.T + b, what the optimiser makes of a
    tied unembedding): a MatMulNBits on the table's rows."""
    plain = all(node.attributes.get_float(a, 1.0) == 1.0 for a in ("alpha", "beta"))
    transposed = (node.attributes.get_int("transA", 0), node.attributes.get_int("transB", 0))
    return plain and transposed == (0, 1) and _is_matrix(node.inputs[1])


def _quantized(
    weights: WeightsFile,
    quantizer: DefaultWeightOnlyQuantizer,
    name: str,
    n: int,
    k: int,
    rows: Callable[[int, int], np.ndarray],
) -> tuple[str, str]:
    """The names of the 8-bit blocks (N, K / block, block) and scales (N * K / block) of
    the matrix `name` that MatMulNBits reads as B: written once, quantized from `rows(a, b)`
    (its rows a..b as (b - a, K) float32) a slice at a time."""
    names = (f"{name}_Q{BITS}", f"{name}_scales")
    if names[0] not in weights:  # another graph of the directory quantized it already
        blocks = k // BLOCK_SIZE + (k % BLOCK_SIZE > 0)
        packed = np.empty((n, blocks, BLOCK_SIZE), np.uint8)
        scales = np.empty((n, blocks), np.float32)
        step = max(1, ROWS_AT_ONCE_BYTES // (4 * k))
        for a in range(0, n, step):
            b = min(a + step, n)
            # onnxruntime's C++ block quantizer takes (K, N): the slice's columns
            part, part_scales, _ = quantizer.qbits_block_quant(np.ascontiguousarray(rows(a, b).T))
            packed[a:b], scales[a:b] = part, part_scales.reshape(b - a, blocks)
        weights.reference(ir.Tensor(packed, name=names[0]))
        weights.reference(ir.Tensor(scales.reshape(-1), name=names[1]))
    return names


def _to_matmul_nbits(
    graph: ir.Model,
    node: ir.Node,
    weights: WeightsFile,
    quantizer: DefaultWeightOnlyQuantizer,
    directory: Path,
) -> None:
    """A MatMul on a weight B (K, N), or a Gemm on a table's transpose (B is (N, K), the
    rows MatMulNBits quantizes: named as the table's transpose, the same bytes), as
    MatMulNBits; a Gemm's bias is its bias."""
    b = node.inputs[1]
    assert b is not None and isinstance(b.const_value, ir.ExternalTensor)
    source = b.const_value
    inputs = [node.inputs[0]]
    if node.op_type == "Gemm":
        n, k = source.shape.numpy()
        name = f"{b.name}{TRANSPOSED_SUFFIX}"
        names = _quantized(
            weights, quantizer, name, n, k, lambda s, e: _read_rows(source, directory, s, e)
        )
        bias = node.inputs[2] if len(node.inputs) > 2 else None
    else:
        k, n = source.shape.numpy()
        values = cache(lambda: _read(source, directory))  # (K, N), read if not quantized
        names = _quantized(weights, quantizer, str(b.name), n, k, lambda s, e: values()[:, s:e].T)
        bias = None
    inputs += [_initializer(graph, weights[name]) for name in names]
    if bias is not None:  # after the zero points and group indices, both left out
        inputs += [None, None, bias]
    attributes = {"K": int(k), "N": int(n), "bits": BITS, "block_size": BLOCK_SIZE}
    _replace(graph, node, "MatMulNBits", inputs, attributes, b)


def _to_gather_block_quantized(
    graph: ir.Model,
    node: ir.Node,
    weights: WeightsFile,
    quantizer: DefaultWeightOnlyQuantizer,
    directory: Path,
) -> None:
    table = node.inputs[0]
    assert table is not None and isinstance(table.const_value, ir.ExternalTensor)
    n, k = table.const_value.shape.numpy()
    # Named as the transposed table MatMulNBits reads (a tied unembedding): the same bytes.
    name = f"{table.name}{TRANSPOSED_SUFFIX}"
    external = table.const_value
    packed, scales = _quantized(
        weights, quantizer, name, n, k, lambda a, b: _read_rows(external, directory, a, b)
    )
    # The same bytes seen as GatherBlockQuantized reads them: (N, K) and (N, K / block).
    rows = weights.view(packed, f"{packed}_rows", (n, k))
    row_scales = weights.view(scales, f"{scales}_rows", (n, k // BLOCK_SIZE))
    inputs = [_initializer(graph, rows), node.inputs[1], _initializer(graph, row_scales)]
    attributes = {"bits": BITS, "block_size": BLOCK_SIZE, "gather_axis": 0, "quantize_axis": 1}
    _replace(graph, node, "GatherBlockQuantized", inputs, attributes, table)


def _replace(
    graph: ir.Model,
    node: ir.Node,
    op_type: str,
    inputs: list[ir.Value | None],
    attributes: dict[str, int],
    weight: ir.Value,
) -> None:
    """`node` replaced by the com.microsoft `op_type`, its output keeping its name; the
    float32 weight goes where nothing else reads it."""
    if op_type == "MatMulNBits":
        attributes = {**attributes, "accuracy_level": ACCURACY_LEVEL}
    replacement = ir.node(
        op_type, inputs=inputs, attributes=attributes, domain="com.microsoft",
        name=f"{node.name}_Q{BITS}",
    )  # fmt: skip
    graph.graph.insert_after(node, replacement)
    output, new = node.outputs[0], replacement.outputs[0]
    new.type, new.shape = output.type, output.shape  # a graph output (the lens' logits) has them
    output.replace_all_uses_with(new, replace_graph_outputs=True)
    graph.graph.remove(node, safe=True)
    new.name = output.name
    if not weight.uses():
        graph.graph.initializers.pop(str(weight.name))


def _read(tensor: ir.TensorProtocol, directory: Path) -> np.ndarray:
    """An external tensor's values, read from its file alone (not the whole file mapped)."""
    assert isinstance(tensor, ir.ExternalTensor)
    count = int(np.prod(tensor.shape.numpy()))
    dtype = tensor.dtype.numpy()
    values = np.fromfile(directory / tensor.location, dtype, count, offset=tensor.offset or 0)
    return values.reshape(tensor.shape.numpy())


def _read_rows(tensor: ir.ExternalTensor, directory: Path, start: int, stop: int) -> np.ndarray:
    """Rows start..stop of a two-dimensional external tensor, read from its file alone."""
    width = int(tensor.shape.numpy()[1])
    dtype = tensor.dtype.numpy()
    offset = (tensor.offset or 0) + start * width * dtype.itemsize
    values = np.fromfile(directory / tensor.location, dtype, (stop - start) * width, offset=offset)
    return values.reshape(stop - start, width)


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
