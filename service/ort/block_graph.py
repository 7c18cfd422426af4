"""The ONNX graph that computes one block of query rows' attention statistics from queries
and keys: never more than the block's rows x keys of a layer's scores.

A long text's full map does not fit (Llama-3.2-1B at 8,192 tokens: 16 layers x 32 heads x
8,192^2 floats = 137 GB), and every statistic of a row needs only that row's scores: the
row's log-sum-exp makes its weights exactly, p = exp(s - lse). So the statistics are
computed a block of rows at a time, one layer at a time, from the queries and keys the
queries graph returns (artifacts.query_key_sites), on the serving provider:

- each row's weights over its keys: kept whole (chosen rows), as a tile of keys
  [key_start, key_end), or as their top k (values and indices, -1 past the row's keys);
- each row's entropy, lse - sum(p s) (no log of a zero weight), per head;
  lse itself from the softmax, s_max - ln p_max;
- each key's received attention: the block's column sums (the caller adds the blocks up).

Scores are as the model makes them: the scale, Gemma 2's soft-cap before the mask, the
causal mask and a sliding window; grouped key/value heads are gathered per query head.
One graph per recipe; the layer's window, the rows, heads, k and the tile are inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import TensorProto

from attnserve.service.ort.reducer_graph import GraphBuilder

# An unseen key's score: far below any seen one's, finite (see build_block_graph).
_UNSEEN = -1e30
INPUTS = ("queries", "keys", "kv_heads", "rows", "window", "k", "key_range")
_FLOAT_INPUTS = ("queries", "keys")


@dataclass(frozen=True)
class BlockRecipe:
    """What a block's graph computes. Inputs: queries (R, H', dh) and keys (H_kv, T, dh)
    float32 (the layer's: the graph takes those the rows see); kv_heads (H',), rows (R,),
    window (1,) (0: none), k (1,), key_range (2,) int64."""

    scale: float
    groups: int = 0  # > 0: every head, H = H_kv x groups (no kv_heads gather)
    softcap: float | None = None
    reduction: str = "none"  # over heads, for the weights and received attention
    weights: bool = False  # the rows' weights over key_range
    top_k: bool = False
    entropy: bool = False  # per head, whatever the reduction
    received: bool = False

    @property
    def inputs(self) -> list[str]:
        unused = {"k": not self.top_k, "key_range": not self.weights, "kv_heads": self.groups}
        return [name for name in INPUTS if not unused.get(name)]


def build_block_graph(recipe: BlockRecipe) -> onnx.ModelProto:
    """The ONNX model of `recipe`; outputs weights, values and indices (int32), entropy
    (H', R) and received (H' or 1, S) as asked."""
    b = GraphBuilder()
    # the keys any row of the block sees: 0 .. max(rows), a copy of contiguous runs
    size = b.op("Add", b.reduce("max", "rows", axis=0, keepdims=1), b.ints(1))  # (1,) = [S]
    keys = b.op("Slice", "keys", b.ints(0), size, b.ints(1))  # (H_kv, S, dh)
    q = b.op("Mul", "queries", b.float(recipe.scale))  # (R, H', dh)
    if recipe.groups:  # each key head times its group of query heads, keys not repeated
        grouped = b.op("Concat", b.ints(0, -1, recipe.groups), b.op("Shape", q, start=2), axis=0)
        q = b.op("Reshape", q, grouped)  # (R, H_kv, G, dh)
        q = b.op("Transpose", q, perm=[1, 2, 0, 3])  # (H_kv, G, R, dh)
        keys_t = b.op("Transpose", b.op("Unsqueeze", keys, b.ints(1)), perm=[0, 1, 3, 2])
        scores = b.op("MatMul", q, keys_t)  # (H_kv, G, R, S): the transpose fused into it
        rows_keys = b.op("Shape", scores, start=2)
        scores = b.op("Reshape", scores, b.op("Concat", b.ints(-1), rows_keys, axis=0))
    else:
        q = b.op("Transpose", q, perm=[1, 0, 2])  # (H', R, dh)
        keys = b.op("Gather", keys, "kv_heads", axis=0)  # (H', S, dh)
        scores = b.op("MatMul", q, b.op("Transpose", keys, perm=[0, 2, 1]))  # (H', R, S)
    if recipe.softcap is not None:  # before the mask, as the model does
        cap = b.float(recipe.softcap)
        scores = b.op("Mul", b.op("Tanh", b.op("Div", scores, cap)), cap)
    # key j is seen by row i where j <= i and, with a window of w keys, j > i - w
    key = b.op("Range", b.scalar_int(0), b.op("Squeeze", size), b.scalar_int(1))  # (S,)
    row = b.op("Unsqueeze", "rows", b.ints(1))  # (R, 1)
    window = b.op("Where", b.op("Greater", "window", b.ints(0)), "window", size)
    first = b.op("Sub", row, window)  # (R, 1): the last key before the window
    seen = b.op("And", b.op("LessOrEqual", key, row), b.op("Greater", key, first))  # (R, S)
    # Unseen keys get a finite floor added rather than -inf: exp makes them exactly 0 all the
    # same, p * s stays 0 there (0 * -inf is NaN), so the entropy needs no second mask; and
    # an Add broadcast over the heads is a vectorized pass where a Where is not (3x slower).
    floor = b.op("Where", seen, b.float(0.0), b.float(_UNSEEN))  # (R, S), once per block
    masked = b.op("Add", scores, floor)  # (H', R, S)
    p = b.op("Softmax", masked, axis=-1)  # one fused pass per row
    outputs: dict[str, tuple[str, int, int]] = {}  # name -> (value, dtype, rank)
    if recipe.entropy:
        # H = -sum p ln p = lse - sum p s, and lse = s_max - ln p_max (p_max = exp(s_max -
        # lse)): no exponential beyond the softmax's
        top = b.reduce("max", masked, axis=2, keepdims=0)  # (H', R)
        lse = b.op("Sub", top, b.op("Log", b.reduce("max", p, axis=2, keepdims=0)))
        expected = b.reduce("sum", b.op("Mul", p, masked), axis=2, keepdims=0)
        outputs["entropy"] = (b.op("Sub", lse, expected), TensorProto.FLOAT, 2)
    y = p
    if recipe.reduction != "none":
        y = b.reduce(recipe.reduction, p, axis=0, keepdims=1)  # (1, R, S)
    if recipe.received:
        outputs["received"] = (b.reduce("sum", y, axis=1, keepdims=0), TensorProto.FLOAT, 2)
    if recipe.weights:
        tile = b.op(
            "Slice",
            y,
            b.op("Slice", "key_range", b.ints(0), b.ints(1)),
            b.op("Slice", "key_range", b.ints(1), b.ints(2)),
            b.ints(2),
        )
        outputs["weights"] = (tile, TensorProto.FLOAT, 3)
    if recipe.top_k:
        kk = b.op("Min", "k", size)
        values, indices = b.multi("TopK", y, kk, axis=-1, largest=1, sorted=1, outputs=2)
        # keys a row does not see (fewer than k of them) become index -1 and value 0
        valid = b.op("And", b.op("LessOrEqual", indices, row), b.op("Greater", indices, first))
        indices = b.op("Where", valid, indices, b.ints(-1))
        values = b.op("Where", valid, values, b.float(0.0))
        outputs["values"] = (values, TensorProto.FLOAT, 3)
        outputs["indices"] = (b.op("Cast", indices, to=TensorProto.INT32), TensorProto.INT32, 3)

    inputs = {
        name: (TensorProto.FLOAT, 3) if name in _FLOAT_INPUTS else (TensorProto.INT64, 1)
        for name in recipe.inputs
    }
    return b.model("attention_block", inputs, outputs)
