"""The small ONNX graph that turns one sequence's full attention into what was asked for.

The model writes every layer's and head's T x T weights; a request may want a few
rows, the heads averaged, attention rollout, the k largest weights or each head's
entropy. `build_graph(recipe)` writes that as ONNX so that it runs in ONNX Runtime
on the serving provider, next to the weights: on CUDA the T x T tensors need not
cross to the host, and on CPU no numpy pass copies them in float32.

One graph per recipe (which steps are present); what varies per request (the
layers, heads, rows, k, the sequence's length) are inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

OPSET = 21
IR_VERSION = 10  # what every onnxruntime >= 1.20 loads
# ln(p) of p = 0 is -inf and 0 * -inf is NaN; p ln p -> 0 as p -> 0, so clamp first.
_TINY = 1e-30


@dataclass(frozen=True)
class Recipe:
    """Which steps a graph has. Inputs: attention (L, H, Tm, Tm) float32 always, plus
    length (1,), layers (L',), heads (H',), rows (R,), k (1,) int64 where a step needs them."""

    trim: bool = False  # the sequence is shorter than its batch: cut (Tm, Tm) to (T, T)
    pick_layers: bool = False
    pick_heads: bool = False
    pick_rows: bool = False
    reduction: str = "none"  # over heads: "none", "mean" or "max"
    rollout_layers: int = 0  # rollout over this many layers (0: no rollout)
    top_k: bool = False
    entropy: bool = False
    weights: bool = True  # output the (reduced) weights
    float16: bool = False  # weights leave as float16

    @property
    def inputs(self) -> list[str]:
        needs = {
            "attention": True,
            "length": self.trim,
            "layers": self.pick_layers,
            "heads": self.pick_heads,
            "rows": self.pick_rows or self.top_k,
            "k": self.top_k,
        }
        return [name for name, needed in needs.items() if needed]


class GraphBuilder:
    """Appends nodes with fresh output names; a thin layer over onnx.helper."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self._count = 0

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        """A node of one output; its name."""
        return self.multi(op_type, *inputs, outputs=1, **attrs)[0]

    def multi(self, op_type: str, *inputs: str, outputs: int, **attrs) -> list[str]:
        """A node of `outputs` outputs; their names."""
        names = [f"{op_type.lower()}_{self._count}_{i}" for i in range(outputs)]
        self._count += 1
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names

    def ints(self, *values: int) -> str:
        return self.op(
            "Constant", value=helper.make_tensor("c", TensorProto.INT64, [len(values)], values)
        )

    def scalar_int(self, value: int) -> str:
        return self.op("Constant", value=helper.make_tensor("c", TensorProto.INT64, [], [value]))

    def float(self, value: float) -> str:
        return self.op("Constant", value=helper.make_tensor("c", TensorProto.FLOAT, [], [value]))

    def reduce(self, kind: str, x: str, axis: int, keepdims: int) -> str:
        op_type = {"mean": "ReduceMean", "max": "ReduceMax", "sum": "ReduceSum"}[kind]
        return self.op(op_type, x, self.ints(axis), keepdims=keepdims)

    def model(
        self,
        name: str,
        inputs: Mapping[str, tuple[int, int]],
        outputs: Mapping[str, tuple[str, int, int]],
    ) -> onnx.ModelProto:
        """The checked model of the nodes so far: `inputs` name -> (dtype, rank), `outputs`
        name -> (the value it is, dtype, rank); every axis dynamic."""
        values = []
        for output, (value, dtype, rank) in outputs.items():
            self.nodes.append(helper.make_node("Identity", [value], [output]))
            values.append(helper.make_tensor_value_info(output, dtype, [None] * rank))
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info(n, t, [None] * r) for n, (t, r) in inputs.items()],
            values,
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
        )
        onnx.checker.check_model(model)
        return model


def build_graph(recipe: Recipe) -> onnx.ModelProto:
    """The ONNX model for `recipe`; outputs `weights`, `indices` (int32), `entropy` as asked."""
    if recipe.reduction not in ("none", "mean", "max"):
        raise ValueError(f"reduction must be none, mean or max, got {recipe.reduction!r}")
    b = GraphBuilder()
    x = "attention"  # (L, H, Tm, Tm)
    if recipe.trim:
        x = b.op("Slice", x, b.ints(0, 0), b.op("Concat", "length", "length", axis=0), b.ints(2, 3))
    if recipe.pick_layers:
        x = b.op("Gather", x, "layers", axis=0)
    if recipe.pick_heads:
        x = b.op("Gather", x, "heads", axis=1)  # (L', H', T, T)
    rows_of_x = b.op("Gather", x, "rows", axis=2) if recipe.pick_rows else x  # (L', H', R, T)

    float16 = TensorProto.FLOAT16 if recipe.float16 else TensorProto.FLOAT
    outputs: dict[str, tuple[str, int, int]] = {}  # name -> (value, dtype, rank)
    if recipe.entropy:
        p_ln_p = b.op("Mul", rows_of_x, b.op("Log", b.op("Max", rows_of_x, b.float(_TINY))))
        per_row = b.reduce("sum", p_ln_p, axis=3, keepdims=0)  # (L', H', R)
        entropy = b.op("Neg", b.reduce("mean", per_row, axis=2, keepdims=0))
        outputs["entropy"] = (entropy, TensorProto.FLOAT, 2)

    if recipe.rollout_layers:
        y = _rollout(b, x, recipe)  # (1, 1, R, T)
    else:
        y = rows_of_x
        if recipe.reduction != "none":
            y = b.reduce(recipe.reduction, y, axis=1, keepdims=1)  # (L', 1, R, T)

    if recipe.top_k:
        y, indices = _top_k(b, y)
        outputs["indices"] = (b.op("Cast", indices, to=TensorProto.INT32), TensorProto.INT32, 4)
    if recipe.weights:
        if recipe.float16:
            y = b.op("Cast", y, to=TensorProto.FLOAT16)
        outputs["weights"] = (b.op("Identity", y), float16, 4)
    inputs = {
        name: (TensorProto.FLOAT, 4) if name == "attention" else (TensorProto.INT64, 1)
        for name in recipe.inputs
    }
    return b.model("attention_summary", inputs, outputs)


def _rollout(b: GraphBuilder, x: str, recipe: Recipe) -> str:
    """(L', H', T, T) -> (1, 1, R, T): R = A'_last ... A'_first on the requested rows.

    Multiplied from the left, starting with the last layer's requested rows: R x T
    times T x T per layer, so a few rows cost a few rows, not a T x T product.
    """
    # With a mean, each head's rows sum to 1 and so do the mean's: 0.5 mean + 0.5 I needs
    # no renormalising, and its scale can wait. The heads' sum (ReduceSum is cheaper than
    # ReduceMean) + H' I has rows summing to 2 H' in every layer, divided out at the end.
    a = b.reduce("max" if recipe.reduction == "max" else "sum", x, axis=1, keepdims=0)
    # The residual stream carries each token's own state past the attention: half identity.
    eye = b.op("EyeLike", b.op("Gather", a, b.scalar_int(0), axis=0))  # (T, T)
    if recipe.reduction == "max":
        # 0.5 A + 0.5 I with rows renormalised is (A + I) / rowsum(A + I).
        a = b.op("Add", a, eye)  # (L', T, T)
        a = b.op("Div", a, b.reduce("sum", a, axis=2, keepdims=1))  # rows sum to 1 again
    else:
        n_heads = b.op("Cast", b.op("Shape", x, start=1, end=2), to=TensorProto.FLOAT)
        a = b.op("Add", a, b.op("Mul", eye, n_heads))  # (L', T, T)
    n = recipe.rollout_layers
    parts = b.multi("Split", a, axis=0, num_outputs=n, outputs=n)
    layer = [b.op("Squeeze", part, b.ints(0)) for part in parts]
    r = layer[-1]
    if recipe.pick_rows:
        r = b.op("Gather", r, "rows", axis=0)  # (R, T)
    for earlier in reversed(layer[:-1]):
        # Every row: both factors are lower triangular, so skip the blocks known to be zero.
        r = b.op("MatMul", r, earlier) if recipe.pick_rows else _lower_matmul(b, r, earlier)
    if recipe.reduction != "max":
        r = b.op("Div", r, b.reduce("sum", r, axis=1, keepdims=1))  # the (2 H')^L' scale
    return b.op("Unsqueeze", r, b.ints(0, 1))


def _lower_matmul(b: GraphBuilder, x: str, y: str, blocks: int = 4) -> str:
    """x @ y for lower triangular (T, T) x and y, in `blocks` column blocks of width w.

    Column block j of the product is nonzero only from row j w down, and there it is
    x[jw:, jw:] @ y[jw:, jw:(j+1)w]: with 4 blocks 47% of a dense product's work.
    """
    size = b.op("Shape", x, start=0, end=1)  # (1,) = [T]
    width = b.op("Div", b.op("Add", size, b.ints(blocks - 1)), b.ints(blocks))  # ceil(T / blocks)
    end = b.ints(2**62)
    columns = []
    for j in range(blocks):
        start = b.op("Mul", width, b.ints(j))  # past T for short sequences: empty slices
        x_j = b.op(
            "Slice", x, b.op("Concat", start, start, axis=0), b.op("Concat", end, end, axis=0)
        )
        stop = b.op("Add", start, width)
        y_j = b.op(
            "Slice", y, b.op("Concat", start, start, axis=0), b.op("Concat", end, stop, axis=0)
        )
        column = b.op("MatMul", x_j, y_j)  # (T - jw, w)
        above = b.op("Sub", size, b.op("Shape", column, start=0, end=1))  # the zero rows
        pads = b.op("Concat", above, b.ints(0, 0, 0), axis=0)
        columns.append(b.op("Pad", column, pads))  # (T, w)
    return b.op("Concat", *columns, axis=1)  # (T, T)


def _top_k(b: GraphBuilder, y: str) -> tuple[str, str]:
    """(..., R, T) -> values, indices (..., R, k): keys past a row's own position
    (no weight by causality) become index -1 and value 0, and so does the padding
    of a sequence shorter than k."""
    keys = b.op("Slice", b.op("Shape", y), b.ints(-1), b.ints(2**62))  # (1,) = [T]
    kk = b.op("Min", "k", keys)
    values, indices = b.multi("TopK", y, kk, axis=-1, largest=1, sorted=1, outputs=2)
    beyond = b.op("Greater", indices, b.op("Unsqueeze", "rows", b.ints(1)))  # vs (R, 1)
    indices = b.op("Where", beyond, b.ints(-1), indices)
    values = b.op("Where", beyond, b.float(0.0), values)
    pads = b.op("Concat", b.ints(0, 0, 0, 0, 0, 0, 0), b.op("Sub", "k", kk), axis=0)
    values = b.op("Pad", values, pads, b.float(0.0))
    indices = b.op("Pad", indices, pads, b.scalar_int(-1))
    return values, indices
