"""A float32 graph with 8-bit weights: MatMulNBits (com.microsoft), int8 arithmetic.

For models that do not fit in float32 (`--precision int8`): each MatMul whose weight is
in the weights file becomes ONNX Runtime's MatMulNBits with that weight quantized in
blocks along its input axis (symmetric int8 and a float32 scale per block of
BLOCK_SIZE), `accuracy_level` 4 (int8 activations), a tied unembedding (a Gemm by the
token table's transpose) included; each Gather of a table's rows (the token table) reads
it in float16. Norms and biases stay float32. Of what ONNX Runtime 1.31 offers on
this CPU it is the one that keeps a 0.5B model's attention within 0.02 and its embeddings
at cosine >= 0.99; it saves memory, not time (research/int8-on-cpu measures it against 4
bits and dynamic int8).
The quantization itself is onnxruntime's own (its C++ block quantizer); it runs one weight
at a time, read from the float32 weights file (a table a slice of rows at a time) or, for
a matrix a streamed import left out of that file, from the checkpoint, so the
conversion holds one tensor of float32 at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
from onnxruntime.quantization.matmul_nbits_quantizer import (
    DefaultWeightOnlyQuantConfig,
    DefaultWeightOnlyQuantizer,
)

from attnserve.export import INT8_ARITHMETICS
from attnserve.export.onnx_files import save_checked
from attnserve.export.weights import TRANSPOSED_SUFFIX, WeightsFile, externalize

BITS = 8
# Weights per scale along K: 32 keeps attention within 0.011 where 128 gives 0.019, at the
# same speed (research/int8-on-cpu).
BLOCK_SIZE = 32
ACCURACY_LEVEL = 4  # int8 activations x int8 weights
# `--int8-arithmetic float32`: the 8-bit weights times float32 activations. Attention
# about twice as close to float32's (0.009 where int8 arithmetic gives 0.016, Qwen2.5-0.5B's
# shape), 2.4x slower at 128 tokens and 20x at 8 on this CPU (research/int8-on-cpu).
FLOAT32_ACCURACY_LEVEL = 1
# How much of a matrix is quantized at once: a token table of 256k rows is read in slices.
ROWS_AT_ONCE_BYTES = 64 << 20
FLOAT16_SUFFIX = ".fp16"  # the name of a table stored in float16 for its rows


def convert_to_int8(
    src: str | Path,
    dst: str | Path,
    weights: WeightsFile,
    unwritten: Mapping[str, ir.TensorProtocol] | None = None,
    arithmetic: str = "int8",
) -> Path:
    """Write `src` with its matrix weights in 8 bits to `dst`, every weight (quantized or
    not) into `weights`, checked: each MatMul on a weight (and a Gemm by a table's
    transpose) becomes MatMulNBits, each Gather of a table's rows (the token table; an
    unembedding's rows for attribution) a Gather on the table in float16.
    unwritten: the float32 tensors, by name, that `src`'s weights file left out (holes):
    read from here (WeightsFile.unwritten). arithmetic: what MatMulNBits multiplies the
    8-bit weights by, int8 (the activations quantized in blocks too: fastest) or float32."""
    if arithmetic not in INT8_ARITHMETICS:
        raise ValueError(f"arithmetic must be one of {INT8_ARITHMETICS}, got {arithmetic!r}")
    src = Path(src)
    graph = ir.from_proto(onnx.load(str(src), load_external_data=False))
    accuracy = ACCURACY_LEVEL if arithmetic == "int8" else FLOAT32_ACCURACY_LEVEL
    conversion = _Conversion(graph, weights, src.parent, unwritten or {}, accuracy)
    for node in list(graph.graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        matmul = node.op_type == "MatMul" and _is_matrix(node.inputs[1])
        if matmul or (node.op_type == "Gemm" and _is_unembedding(node)):
            conversion.to_matmul_nbits(node)
        elif node.op_type == "Gather" and _is_matrix(node.inputs[0]):
            conversion.to_float16_gather(node)
    graph.opset_imports["com.microsoft"] = 1
    # The float32 weights left (norms, biases) move along, read one at a time when
    # written: one weights file per precision.
    # The 8-bit ones are in `weights` already (and may not be on disk yet: buffered).
    for value in graph.graph.initializers.values():
        if isinstance(value.const_value, ir.ExternalTensor) and str(value.name) not in weights:
            value.const_value = conversion.lazy(value.const_value)
    externalize(graph, weights)
    return save_checked(ir.to_proto(graph), dst)


def is_matrix(tensor: ir.TensorProtocol) -> bool:
    """A float32 tensor of two dimensions: what the conversion rewrites (the weights a
    streamed import leaves out of its float32 file)."""
    return len(tensor.shape) == 2 and tensor.dtype == ir.DataType.FLOAT


def _is_matrix(value: ir.Value | None) -> bool:
    """A float32 initializer of two dimensions, in the weights file."""
    if value is None or not value.is_initializer() or value.const_value is None:
        return False
    return is_matrix(value.const_value)


def _is_unembedding(node: ir.Node) -> bool:
    """A Gemm of rows by a table's transpose (x @ W.T + b, what the optimiser makes of a
    tied unembedding): a MatMulNBits on the table's rows."""
    plain = all(node.attributes.get_float(a, 1.0) == 1.0 for a in ("alpha", "beta"))
    transposed = (node.attributes.get_int("transA", 0), node.attributes.get_int("transB", 0))
    return plain and transposed == (0, 1) and _is_matrix(node.inputs[1])


class _Conversion:
    """One graph's operators rewritten in 8 bits, their weights read from the float32 files
    in `directory` (or from `unwritten`, where the file left them out) and written once
    into `weights` (shared by a directory's graphs)."""

    def __init__(
        self,
        graph: ir.Model,
        weights: WeightsFile,
        directory: Path,
        unwritten: Mapping[str, ir.TensorProtocol],
        accuracy: int,
    ) -> None:
        self.graph, self.weights, self.directory = graph, weights, directory
        self.unwritten, self.accuracy = unwritten, accuracy
        # The values of the unwritten tensor being converted: a table is read once for
        # all its slices.
        self._held: tuple[str, np.ndarray] | None = None
        self.quantizer = DefaultWeightOnlyQuantizer(
            DefaultWeightOnlyQuantConfig(
                block_size=BLOCK_SIZE, is_symmetric=True, accuracy_level=accuracy, bits=BITS
            )
        )

    def to_matmul_nbits(self, node: ir.Node) -> None:
        """A MatMul on a weight B (K, N), or a Gemm on a table's transpose (B is (N, K), the
        rows MatMulNBits quantizes), as MatMulNBits; a Gemm's bias is its bias."""
        b = node.inputs[1]
        assert b is not None and isinstance(b.const_value, ir.ExternalTensor)
        source = b.const_value
        inputs = [node.inputs[0]]
        if node.op_type == "Gemm":
            n, k = source.shape.numpy()
            names = self._quantized(
                f"{b.name}{TRANSPOSED_SUFFIX}", n, k, lambda s, e: self._rows(source, s, e)
            )
            bias = node.inputs[2] if len(node.inputs) > 2 else None
        else:
            k, n = source.shape.numpy()
            values = cache(lambda: self._values(source))  # (K, N), if not quantized
            names = self._quantized(str(b.name), n, k, lambda s, e: values()[:, s:e].T)
            bias = None
        inputs += [self._initializer(self.weights[name]) for name in names]
        if bias is not None:  # after the zero points and group indices, both left out
            inputs += [None, None, bias]
        attributes = {"K": int(k), "N": int(n), "bits": BITS, "block_size": BLOCK_SIZE}
        attributes["accuracy_level"] = self.accuracy
        matmul = ir.node(
            "MatMulNBits", inputs, attributes=attributes, domain="com.microsoft",
            name=f"{node.name}_Q{BITS}",
        )  # fmt: skip
        self._replace(node, [matmul], b)

    def to_float16_gather(self, node: ir.Node) -> None:
        """A Gather of a table's rows on the table in float16, its rows cast back: half
        the bytes at float16's precision. 8-bit rows (GatherBlockQuantized) moved
        Llama-3.1-8B's attention from 0.041 to 0.057 of float32's, past the gate
        (research/int8-on-cpu)."""
        table = node.inputs[0]
        assert table is not None and isinstance(table.const_value, ir.ExternalTensor)
        source = table.const_value
        name = f"{table.name}{FLOAT16_SUFFIX}"
        if name not in self.weights:
            n, k = source.shape.numpy()
            half = np.empty((n, k), np.float16)
            for a, b in _slices(n, k):
                half[a:b] = self._rows(source, a, b)
            self.weights.reference(ir.Tensor(half, name=name))
        axis = {"axis": node.attributes.get_int("axis", 0)}
        gather = ir.node("Gather", [self._initializer(self.weights[name]), node.inputs[1]], axis)
        cast = ir.node("Cast", gather.outputs, attributes={"to": ir.DataType.FLOAT})
        self._replace(node, [gather, cast], table)

    def _quantized(
        self, name: str, n: int, k: int, rows: Callable[[int, int], np.ndarray]
    ) -> tuple[str, str]:
        """The names of the 8-bit blocks (N, K / block, block) and scales (N * K / block) of
        the matrix `name` that MatMulNBits reads as B: written once, quantized from
        `rows(a, b)` (its rows a..b as (b - a, K) float32) a slice at a time."""
        names = (f"{name}_Q{BITS}", f"{name}_scales")
        if names[0] not in self.weights:  # another graph of the directory quantized it
            blocks = k // BLOCK_SIZE + (k % BLOCK_SIZE > 0)
            packed = np.empty((n, blocks, BLOCK_SIZE * BITS // 8), np.uint8)
            scales = np.empty((n, blocks), np.float32)
            for a, b in _slices(n, k):
                # onnxruntime's C++ block quantizer takes (K, N): the slice's columns
                columns = np.ascontiguousarray(rows(a, b).T)
                part, part_scales, _ = self.quantizer.qbits_block_quant(columns)
                packed[a:b], scales[a:b] = part, part_scales.reshape(b - a, blocks)
            self.weights.reference(ir.Tensor(packed, name=names[0]))
            self.weights.reference(ir.Tensor(scales.reshape(-1), name=names[1]))
        return names

    def lazy(self, tensor: ir.ExternalTensor) -> ir.LazyTensor:
        """`tensor`, read when it is written."""

        def read() -> ir.Tensor:
            return ir.Tensor(self._values(tensor), name=tensor.name)

        return ir.LazyTensor(read, tensor.dtype, tensor.shape, name=tensor.name)

    def _values(self, tensor: ir.ExternalTensor) -> np.ndarray:
        """An external tensor's values, read from its file alone (not the whole file
        mapped), or from its source if the file left it out."""
        name = str(tensor.name)
        if name in self.unwritten:
            if self._held is None or self._held[0] != name:
                self._held = None  # the last one let go before the next is read
                self._held = (name, self.unwritten[name].numpy())
            return self._held[1]
        count = int(np.prod(tensor.shape.numpy()))
        dtype = tensor.dtype.numpy()
        values = np.fromfile(
            self.directory / tensor.location, dtype, count, offset=tensor.offset or 0
        )
        return values.reshape(tensor.shape.numpy())

    def _rows(self, tensor: ir.ExternalTensor, start: int, stop: int) -> np.ndarray:
        """Rows start..stop of a two-dimensional external tensor, read from its file alone
        (or its source's values)."""
        if str(tensor.name) in self.unwritten:
            return self._values(tensor)[start:stop]
        width = int(tensor.shape.numpy()[1])
        dtype = tensor.dtype.numpy()
        offset = (tensor.offset or 0) + start * width * dtype.itemsize
        path = self.directory / tensor.location
        values = np.fromfile(path, dtype, (stop - start) * width, offset=offset)
        return values.reshape(stop - start, width)

    def _replace(self, node: ir.Node, replacements: list[ir.Node], weight: ir.Value) -> None:
        """`node` replaced by `replacements` (in order, the last one's output taking over
        its output and its name); the float32 `weight` goes where nothing else reads it."""
        graph = self.graph.graph
        graph.insert_after(node, replacements)
        output, new = node.outputs[0], replacements[-1].outputs[0]
        new.type, new.shape = output.type, output.shape  # a graph output (lens' logits) has them
        output.replace_all_uses_with(new, replace_graph_outputs=True)
        graph.remove(node, safe=True)
        new.name = output.name
        self._held = None
        if not weight.uses():
            graph.initializers.pop(str(weight.name))

    def _initializer(self, tensor: ir.ExternalTensor) -> ir.Value:
        """The graph's initializer for `tensor` (a reference into the weights file), made
        once."""
        initializers = self.graph.graph.initializers
        name = str(tensor.name)
        if name not in initializers:
            value = ir.Value(name=name, shape=tensor.shape, type=ir.TensorType(tensor.dtype))
            value.const_value = tensor
            self.graph.graph.register_initializer(value)
        return initializers[name]


def _slices(n: int, k: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of the slices of rows a matrix of n rows of k float32 is read in."""
    step = max(1, ROWS_AT_ONCE_BYTES // (4 * k))
    for start in range(0, n, step):
        yield start, min(start + step, n)
