"""The ORT floor's graph does exactly the model's matrix products (moved here from
tests/bench with the floors). Run from the repository root:

    .venv/bin/python -m pytest research/runtime-floors
"""

import math

import onnx
from floors import matmul_graph

from attnserve.bench.latency import model_flops
from tests.conftest import SMALL_CONFIG


def test_ort_matmul_floor_does_the_models_matmul_flops():
    graph = onnx.shape_inference.infer_shapes(
        matmul_graph(SMALL_CONFIG, batch=3, seq_len=5), strict_mode=True
    ).graph
    shapes = {w.name: list(w.dims) for w in graph.initializer}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        shapes[value.name] = [d.dim_value for d in value.type.tensor_type.shape.dim]
    assert {n.op_type for n in graph.node} == {"MatMul"}
    flops = sum(  # 2 x the output's size x the contracted size, per product
        2 * math.prod(shapes[n.output[0]]) * shapes[n.input[0]][-1] for n in graph.node
    )
    assert flops == model_flops(SMALL_CONFIG, 3, 5)
