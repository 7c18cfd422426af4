"""One weights file that every graph of a model directory points into (ONNX external data).

A model costs its weights once on disk: the graphs of a directory (the full graph,
the embeddings-only one, the fused one) keep only their small constants inline and
refer to each weight by (location, offset, length) in one file, written once, one
tensor at a time. A weight seen again in a later graph, by the same name, is the same
bytes already written: the graphs are traced from one model, so a name is one tensor.

A streamed int8 import's float32 file leaves its matrices out (`leave_out`): their
places are kept as holes, which take no disk, and the int8 conversion reads each from
its source (`unwritten`), the checkpoint, instead: 34 GB of float32 never written for a
9B model.

Linear weights are stored the way ONNX's MatMul reads them, (in, out): the traced
graph transposes PyTorch's (out, in) at every run otherwise, and ONNX Runtime would
fold that transpose into a second, private copy of every weight at load.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Container
from pathlib import Path

import numpy as np
import onnx_ir as ir
import torch

# Element types whose numpy arrays hold the bytes ONNX writes (little-endian, unpacked).
_AS_NUMPY_HOLDS_THEM = frozenset(
    {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.INT64, ir.DataType.INT32}
    | {ir.DataType.UINT8, ir.DataType.INT8}
)
# Constants up to this size stay inside the graph (small biases, shape constants).
INLINE_BYTES = 1024
# Tensors start on a page boundary, so that each can be memory-mapped where it lies.
ALIGNMENT = 4096
TRANSPOSED_SUFFIX = ".T"  # the name of a weight stored transposed, (in, out)


class WeightsFile:
    """Appends tensors to one file and hands out references to them, once per name."""

    def __init__(
        self,
        path: str | Path,
        progress: Callable[[int], None] | None = None,
        leave_out: Callable[[ir.TensorProtocol], bool] | None = None,
    ) -> None:
        self.path = Path(path)
        self._file = self.path.open("wb")
        self._tensors: dict[str, ir.ExternalTensor] = {}
        self._progress = progress  # called with the bytes written so far
        self._leave_out = leave_out
        # name -> the tensor whose place in the file is a hole, to be read from here
        self.unwritten: dict[str, ir.TensorProtocol] = {}

    def reference(self, tensor: ir.TensorProtocol) -> ir.ExternalTensor:
        """`tensor` as a reference into the file: written the first time its name is seen."""
        name = tensor.name or ""
        known = self._tensors.get(name)
        if known is not None:
            if known.dtype != tensor.dtype or tuple(known.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"two graphs hold different tensors named {name!r}: "
                    f"{known.dtype} {known.shape} and {tensor.dtype} {tensor.shape}"
                )
            return known
        offset = -self._file.tell() % ALIGNMENT + self._file.tell()
        if self._leave_out is not None and self._leave_out(tensor):
            self.unwritten[name] = tensor  # nothing read: its place is skipped
            length = tensor.nbytes
            self._file.seek(offset + length)
        else:
            self._file.seek(offset)
            data = _raw_bytes(tensor)  # one tensor in memory at a time
            self._file.write(data)
            length = data.nbytes
        self._tensors[name] = ir.ExternalTensor(
            self.path.name,
            offset,
            length,
            tensor.dtype,
            shape=ir.Shape(tensor.shape.numpy()),
            name=name,
            base_dir=self.path.parent,
        )
        if self._progress is not None:
            self._progress(self._file.tell())
        return self._tensors[name]

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def know(self, index_path: Path) -> None:
        """Hand out references into another weights file of the same directory for the
        tensors its index names (a graph added later shares a model's weights on disk)."""
        index = json.loads(index_path.read_text())
        for name, entry in index["tensors"].items():
            self._tensors[name] = ir.ExternalTensor(
                index["file"],
                entry["offset"],
                entry["length"],
                ir.DataType[entry["dtype"]],
                shape=ir.Shape(entry["shape"]),
                name=name,
                base_dir=index_path.parent,
            )

    def write_index(self, path: Path) -> None:
        """What the file holds, by name (its place, length, dtype and shape): what a later
        graph or `read_tensors` finds the tensors by."""
        tensors = {
            name: {
                "offset": t.offset,
                "length": t.length,
                "dtype": t.dtype.name,
                "shape": list(t.shape.numpy()),
            }
            for name, t in self._tensors.items()
            if t.location == self.path.name and name not in self.unwritten
        }
        path.write_text(json.dumps({"file": self.path.name, "tensors": tensors}) + "\n")

    def __getitem__(self, name: str) -> ir.ExternalTensor:
        return self._tensors[name]

    @property
    def nbytes(self) -> int:
        return self._file.tell()

    def flush(self) -> None:
        """Make what was written readable through the references (the optimiser reads
        small weights, a bias, to decide its rewrites)."""
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.truncate()  # as long as its references say, a hole left out last too
            self._file.close()

    def __enter__(self) -> WeightsFile:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def externalize(model: ir.Model, weights: WeightsFile, names: Container[str] | None = None) -> None:
    """Move the graph's initializers larger than INLINE_BYTES into `weights`.

    names: only initializers with these names (a model's own weights: the exporter's
    other constants may reuse a name across graphs for different values); None: all.
    """
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is None or tensor.nbytes <= INLINE_BYTES:
            continue
        if names is None or value.name in names:
            value.const_value = weights.reference(tensor)


def named_as_encoder(model: ir.Model, prefix: str) -> None:
    """Rename the initializers traced under `prefix` (the attribute of a wrapper module that
    holds the encoder, "model.") to the encoder's own names, as its other graphs hold them
    (and weights.json indexes them)."""
    for name, value in list(model.graph.initializers.items()):
        if name.startswith(prefix):
            model.graph.initializers.pop(name)
            value.name = name.removeprefix(prefix)
            model.graph.initializers.add(value)


def store_linear_weights_transposed(model: ir.Model) -> set[str]:
    """Replace each `Transpose(W, perm=[1, 0])` of an initializer W by an initializer
    `W.T` that holds the transposed values; returns the new names.

    The values are computed when the tensor is written (a LazyTensor), one at a time.
    W itself goes only where nothing else reads it.
    """
    graph = model.graph
    created: set[str] = set()
    for node in list(graph):
        if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
            continue
        source = node.inputs[0]
        perm = node.attributes.get("perm")
        if source is None or not source.is_initializer() or source.const_value is None:
            continue
        if perm is None or list(perm.as_ints()) != [1, 0]:
            continue
        if str(source.name).endswith(TRANSPOSED_SUFFIX):  # W itself: transposed at load
            continue  # (a backward's), never a second copy of it in the file
        name = f"{source.name}{TRANSPOSED_SUFFIX}"
        if name not in graph.initializers:
            transposed = ir.Value(
                name=name,
                shape=ir.Shape(source.const_value.shape.numpy()[::-1]),
                type=source.type,
                const_value=_transposed(source.const_value, name),
            )
            graph.register_initializer(transposed)
            created.add(name)
        node.outputs[0].replace_all_uses_with(graph.initializers[name])
        graph.remove(node, safe=True)
        if not source.uses():
            graph.initializers.pop(str(source.name))
    return created


def products_read_as_stored(model: ir.Model, weights: WeightsFile | None = None) -> None:
    """Each MatMul(x, Transpose(W)) of an initializer W as Gemm(x, W, transB=1), x flattened
    to rows where it has more axes: ONNX Runtime folds every Transpose of a weight into a
    transposed copy in memory at load, and a backward reads each linear weight both ways
    (the forward x @ W.T as stored, the backward g @ W). With `weights`: only where the
    file lacks W.T (a tied table, as the lens reads it, which
    store_linear_weights_transposed would write again, transposed); the double Transpose of
    a gradient through it goes too."""
    for node in list(model.graph):
        table = node.inputs[0] if _transposes(node) else None
        if table is None or not table.is_initializer():
            continue
        if weights is not None and f"{table.name}.T" in weights:
            continue
        for user, index in list(node.outputs[0].uses()):
            x = user.inputs[0]
            if user.op_type == "MatMul" and index == 1 and x is not None and x.shape is not None:
                _as_gemm(model, user, table)
            elif _transposes(user):
                user.outputs[0].replace_all_uses_with(table)
                model.graph.remove(user, safe=True)
        if not node.outputs[0].uses():
            model.graph.remove(node, safe=True)


def _as_gemm(model: ir.Model, product: ir.Node, weight: ir.Value) -> None:
    """MatMul(x, Transpose(weight)) -> Gemm(x as (rows, K), weight, transB=1), reshaped back
    to x's leading axes (read off x at run time: they may be free) and the weight's rows."""
    x, out = product.inputs[0], product.outputs[0]
    assert x is not None and x.shape is not None and weight.shape is not None
    if len(x.shape) == 2:
        nodes = [ir.node("Gemm", [x, weight], attributes={"transB": 1})]
    else:
        n, k = (int(d) for d in weight.shape.numpy())
        rows = ir.node("Reshape", [x, _constant(model, f"{out.name}_rows", [-1, k])])
        gemm = ir.node("Gemm", [rows.outputs[0], weight], attributes={"transB": 1})
        lead = ir.node("Shape", [x], attributes={"end": -1})
        width = _constant(model, f"{out.name}_width", [n])
        shape = ir.node("Concat", [lead.outputs[0], width], attributes={"axis": 0})
        back = ir.node("Reshape", [gemm.outputs[0], shape.outputs[0]])
        nodes = [rows, gemm, lead, shape, back]
    model.graph.insert_after(product, nodes)
    take_place(out, nodes[-1].outputs[0])
    model.graph.remove(product, safe=True)


def _constant(model: ir.Model, name: str, values: list[int]) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(np.array(values, dtype=np.int64)))
    model.graph.register_initializer(value)
    return value


def _transposes(node: ir.Node) -> bool:
    """Whether `node` is a matrix's Transpose."""
    return node.op_type == "Transpose" and list(node.attributes.get_ints("perm", [])) == [1, 0]


def take_place(old: ir.Value, new: ir.Value) -> None:
    """`new` read wherever `old` was, under its name, shape and type."""
    old.replace_all_uses_with(new)
    new.shape, new.type = old.shape, old.type
    if not old.is_graph_output():
        new.name = old.name


def _raw_bytes(tensor: ir.TensorProtocol) -> memoryview:
    """The tensor's bytes as they go on disk, without a copy where numpy holds them so
    (a copy of every weight was a sixth of a 1B model's writing)."""
    if tensor.dtype in _AS_NUMPY_HOLDS_THEM and sys.byteorder == "little":
        return np.ascontiguousarray(tensor.numpy()).data.cast("B")
    return memoryview(tensor.tobytes())  # packed or sub-byte types: ONNX's own layout


def _transposed(tensor: ir.TensorProtocol, name: str) -> ir.LazyTensor:
    def compute() -> ir.Tensor:
        # torch's transposing copy runs on every core, numpy's on one: twice as fast here
        values = torch.from_numpy(tensor.numpy()).t().contiguous().numpy()
        return ir.Tensor(values, name=name)

    shape = ir.Shape(tensor.shape.numpy()[::-1])
    return ir.LazyTensor(compute, tensor.dtype, shape, name=name)


def read_tensors(index_path: Path) -> dict[str, torch.Tensor]:
    """Every tensor a weights file's index names, memory-mapped (copy-on-write: nothing is
    read until used, nothing copied until written); a linear weight stored transposed
    (`W.T`) is also given as W, a view."""
    index = json.loads(index_path.read_text())
    data = np.memmap(index_path.parent / index["file"], dtype=np.uint8, mode="c")
    tensors = {}
    for name, entry in index["tensors"].items():
        dtype = ir.DataType[entry["dtype"]].numpy()
        raw = data[entry["offset"] : entry["offset"] + entry["length"]]
        tensors[name] = torch.from_numpy(raw.view(dtype).reshape(entry["shape"]))
        if name.endswith(TRANSPOSED_SUFFIX):
            tensors.setdefault(name.removesuffix(TRANSPOSED_SUFFIX), tensors[name].T)
    return tensors
