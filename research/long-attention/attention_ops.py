"""ONNX's Attention op against com.microsoft's GroupQueryAttention on ONNX Runtime's CPU
provider: one causal layer of Llama-3.2-1B's shape (32 query heads, 8 key/value heads of 64)
at T tokens, its time and the process's peak resident memory.

    .venv/bin/python research/long-attention/attention_ops.py attention 4096
    .venv/bin/python research/long-attention/attention_ops.py gqa 4096
"""

import resource
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

H, H_KV, D = 32, 8, 64


def attention_op() -> bytes:
    shapes = {"q": [1, H, None, D], "k": [1, H_KV, None, D], "v": [1, H_KV, None, D]}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()]
    node = helper.make_node("Attention", list(shapes), ["y"], is_causal=1)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "attention", inputs, [y])
    opsets = [helper.make_opsetid("", 23)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def gqa_op() -> bytes:
    widths = {"q": H * D, "k": H_KV * D, "v": H_KV * D}
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, None, w]) for n, w in widths.items()
    ]
    inputs += [
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    node = helper.make_node(
        "GroupQueryAttention", ["q", "k", "v", "", "", "seqlens_k", "total"],
        ["y", "present_k", "present_v"], domain="com.microsoft", num_heads=H, kv_num_heads=H_KV,
    )  # fmt: skip
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "gqa", inputs, [y])
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def main(kind: str, t: int) -> None:
    rng = np.random.default_rng(0)
    if kind == "attention":
        model = attention_op()
        feeds = {n: rng.standard_normal((1, h, t, D), dtype=np.float32)
                 for n, h in (("q", H), ("k", H_KV), ("v", H_KV))}  # fmt: skip
    else:
        model = gqa_op()
        feeds = {n: rng.standard_normal((1, t, w), dtype=np.float32)
                 for n, w in (("q", H * D), ("k", H_KV * D), ("v", H_KV * D))}  # fmt: skip
        feeds |= {"seqlens_k": np.array([t - 1], np.int32), "total": np.array(t, np.int32)}
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    session.run(None, feeds)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{kind} T={t}: {seconds:.2f} s, peak {peak:.0f} MiB (inputs in: {before:.0f} MiB)")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
