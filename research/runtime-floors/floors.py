"""The floors under the model's run: its matrix products alone, in torch and in ONNX Runtime.

How close is the served graph to the least any engine built on the same GEMM kernels could
do? `matmul-only` runs only the model's matrix products at its shapes in torch;
`ort-matmul-only` runs the same products as one ONNX Runtime graph of MatMul nodes with the
server's session settings (ORT's own floor). Both are timed beside the served graph
(`ort-cpu`) with the latency sweep's side-by-side timing.

    .venv/bin/python research/runtime-floors/floors.py [--max-seq-len 512] [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from attnserve.bench.engines import Engine
from attnserve.bench.latency import SEQ_LENS, measure_cell
from attnserve.model.config import ModelConfig
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from attnserve.service.ort.sessions import CPU_EP, session_options

Activations = dict[str, tuple[int | str, ...]]
Products = list[tuple[str, str | tuple[int, int]]]


def model_products(
    config: ModelConfig, batch: int | str, seq_len: int | str
) -> tuple[Activations, Products]:
    """One layer's matrix products: the activations' shapes by name, and each product as
    (left activation, right activation or the shape of a weight). Sizes may be names."""
    b, t, d, h = batch, seq_len, config.d_model, config.n_heads
    activations: Activations = {
        "x": (b, t, d),
        "hidden": (b, t, config.d_ff),
        "q": (b, h, t, d // h),
        "k_t": (b, h, d // h, t),
        "weights": (b, h, t, t),
        "v": (b, h, t, d // h),
    }
    products: Products = [
        ("x", (d, 3 * d)),  # fused Q, K, V
        ("q", "k_t"),  # Q K^T
        ("weights", "v"),  # A V
        ("x", (d, d)),  # output projection
        ("x", (d, config.d_ff)),  # MLP in
        ("hidden", (config.d_ff, d)),  # MLP out
    ]
    return activations, products


def matmul_only(config: ModelConfig) -> Engine:
    """Only the model's matrix products, at its shapes, in torch: the floor under any
    engine built on the same kind of GEMM kernels (everything else is overhead)."""
    operands: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def run(ids: np.ndarray) -> object:
        batch, t = ids.shape
        if (batch, t) not in operands:
            activations, products = model_products(config, batch, t)
            tensors = {name: torch.randn(shape) for name, shape in activations.items()}
            operands[(batch, t)] = [
                (tensors[left], tensors[right] if isinstance(right, str) else torch.randn(right))
                for left, right in products
            ]
        with torch.inference_mode():
            for _ in range(config.n_layers):
                for a, b in operands[(batch, t)]:
                    a @ b
        return None

    return run


def matmul_graph(
    config: ModelConfig, batch: int | str = "B", seq_len: int | str = "T"
) -> onnx.ModelProto:
    """The model's products (every layer's, each with its own weights) as one ONNX graph,
    each one MatMul node: the weights are constants (ORT prepacks them, as it does the
    model's), the activations inputs, every product an output."""
    activations, products = model_products(config, batch, seq_len)
    rng = np.random.default_rng(0)
    nodes, weights, outputs = [], [], []
    for layer in range(config.n_layers):
        for i, (left, right) in enumerate(products):
            if isinstance(right, tuple):  # a weight of this layer, of that shape
                weight = rng.standard_normal(right, dtype=np.float32)
                right = f"w{layer}_{i}"
                weights.append(onnx.numpy_helper.from_array(weight, right))
            out = f"y{layer}_{i}"
            nodes.append(onnx.helper.make_node("MatMul", [left, right], [out]))
            outputs.append(onnx.helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None))
    inputs = [
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)
        for name, shape in activations.items()
    ]
    graph = onnx.helper.make_graph(nodes, "matmul_only", inputs, outputs, weights)
    return onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", 21)], ir_version=10
    )


def ort_matmul_only(config: ModelConfig) -> Engine:
    """`matmul_graph` in ONNX Runtime with the server's session settings. Inputs and
    outputs are bound once per shape and stay in ORT's memory: only the products run."""
    session = ort.InferenceSession(
        matmul_graph(config).SerializeToString(),
        session_options(RuntimeOptions(provider="cpu")),
        providers=[CPU_EP],
    )
    bindings: dict[tuple[int, int], tuple[ort.IOBinding, list[np.ndarray]]] = {}
    rng = np.random.default_rng(0)

    def run(ids: np.ndarray) -> object:
        batch, t = ids.shape
        if (batch, t) not in bindings:
            binding, arrays = session.io_binding(), []
            for name, shape in model_products(config, batch, t)[0].items():
                arrays.append(rng.standard_normal(shape, dtype=np.float32))
                binding.bind_cpu_input(name, arrays[-1])  # no copy: keep the array
            for arg in session.get_outputs():
                binding.bind_output(arg.name, "cpu")
            session.run_with_iobinding(binding)  # ORT allocates the outputs once...
            for arg, value in zip(session.get_outputs(), binding.get_outputs(), strict=True):
                binding.bind_ortvalue_output(arg.name, value)  # ...and every run reuses them
            bindings[(batch, t)] = binding, arrays
        binding, _ = bindings[(batch, t)]
        session.run_with_iobinding(binding)
        return binding.get_outputs()

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("models/default"))
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="few repeats (smoke)")
    args = parser.parse_args()
    runtime = OrtRuntime(args.model, RuntimeOptions(provider="cpu"))
    config: ModelConfig = runtime.config
    engines: dict[str, Engine] = {
        "ort-cpu": runtime.run,
        "matmul-only": matmul_only(config),
        "ort-matmul-only": ort_matmul_only(config),
    }
    print("| T | " + " | ".join(engines) + " | served / torch floor | served / ORT floor |")
    print("|---|" + "---|" * (len(engines) + 2))
    rng = np.random.default_rng(0)
    for t in (t for t in SEQ_LENS if t <= min(args.max_seq_len, config.max_seq_len)):
        ids = rng.integers(0, config.vocab_size, size=(1, t), dtype=np.int64)
        samples = measure_cell(engines, ids, args.quick)["samples"]
        p50 = {name: float(np.median(s)) * 1e3 for name, s in samples.items()}
        cells = " | ".join(f"{p50[name]:.2f} ms" for name in engines)
        served = p50["ort-cpu"]
        print(
            f"| {t} | {cells} | {served / p50['matmul-only']:.2f}x "
            f"| {served / p50['ort-matmul-only']:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
