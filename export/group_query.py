"""The queries graph's attention through ONNX Runtime's GroupQueryAttention: no T x T memory.

ONNX's Attention op (opset 23), as ONNX Runtime's CPU kernel runs it, holds every head's
T x T probabilities at once: a 32-head layer at 8,192 tokens would take 8.6 GB, and at 4,096
it took 4.0 s and 2.3 GB where com.microsoft's GroupQueryAttention took 0.6 s and 0.1 GB
(research/long-attention). That op attends a few rows of one head at a time, causally, with
grouped key/value heads, a sliding window and a scale of its own, so the queries graph, which
long texts run, has its Attention nodes replaced by it. Layers with a soft-cap never reach
the Attention op (the fused kernel has none), and the op takes heads of a multiple of 8
dimensions only: there the attention stays as traced (T x T per layer at run time).

The other graphs keep the Attention op: GroupQueryAttention's CUDA kernel takes float16 only
(float32 nodes of it fall back to the CPU there), and the export checks this graph's parity
with PyTorch like any other.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from attnserve.model.config import ModelConfig

HEADS_FIRST = [0, 2, 1, 3]  # (B, T, H, dh) <-> (B, H, T, dh)


def as_group_query_attention(model: ir.Model, config: ModelConfig) -> None:
    """Replace each layer's Attention node (4-D, causal, as traced) of `model` in place."""
    graph = model.graph
    layers = [node for node in graph if node.op_type == "Attention"]  # in layer order
    if not layers or config.head_dim % 8:
        return  # soft-capped, or heads the op does not take: attention as traced
    if len(layers) != config.n_layers:
        raise ValueError(f"expected {config.n_layers} Attention nodes, found {len(layers)}")
    tape = ir.tape.Tape()
    # Every row of a batch sees the whole padded text's keys: padding is on the right, where
    # no causal row of the text looks.
    ids_shape = tape.op("Shape", [graph.inputs[0]])  # (B, T)
    batch = tape.op("Slice", [ids_shape, _ints(tape, [0]), _ints(tape, [1])])
    seq = tape.op("Slice", [ids_shape, _ints(tape, [1]), _ints(tape, [2])])
    last = tape.op("Cast", [tape.op("Sub", [seq, _ints(tape, [1])])], {"to": ir.DataType.INT32})
    seqlens_k = tape.op("Expand", [last, batch])  # (B,) int32: T - 1
    total = tape.op("Cast", [tape.op("Squeeze", [seq])], {"to": ir.DataType.INT32})  # () T
    graph.insert_before(layers[0], tape.nodes)
    flat, split = _tensor([0, 0, -1]), _tensor([0, 0, config.n_heads, config.head_dim])
    for layer, node in enumerate(layers):
        tape = ir.tape.Tape()
        flat_shape = tape.op("Constant", [], {"value": flat})
        q, k, v = (
            tape.op("Reshape", [tape.op("Transpose", [x], {"perm": HEADS_FIRST}), flat_shape])
            for x in node.inputs[:3]
        )  # (B, T, H * dh), (B, T, H_kv * dh) twice
        scale = node.attributes.get("scale")
        window = config.window(layer)
        y, _, _ = tape.op_multi_out(
            "GroupQueryAttention",
            [q, k, v, None, None, seqlens_k, total],
            {
                "num_heads": config.n_heads,
                "kv_num_heads": config.kv_heads,
                "scale": scale.value if scale else 1 / math.sqrt(config.head_dim),
                # keys per query, itself included, as Mistral's window (measured: ORT 1.31)
                "local_window_size": -1 if window is None else window,
            },
            domain="com.microsoft",
            num_outputs=3,
        )  # (B, T, H * dh)
        split_shape = tape.op("Constant", [], {"value": split})
        heads = tape.op("Reshape", [y, split_shape])  # (B, T, H, dh)
        out = tape.op("Transpose", [heads], {"perm": HEADS_FIRST})  # (B, H, T, dh)
        graph.insert_before(node, tape.nodes)
        node.outputs[0].replace_all_uses_with(out)
        graph.remove(node, safe=True)
    model.opset_imports.setdefault("com.microsoft", 1)
    ir.passes.common.RemoveUnusedNodesPass()(model)  # the windows' masks


def _tensor(values: list[int]) -> ir.TensorProtocol:
    """A constant int64 vector."""
    return ir.tensor(np.array(values, dtype=np.int64))


def _ints(tape: ir.tape.Tape, values: list[int]) -> ir.Value:
    """A constant int64 vector, a node's output on `tape`."""
    return tape.op("Constant", [], {"value": _tensor(values)})
