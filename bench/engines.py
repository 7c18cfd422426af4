"""The engines the latency sweep compares: each a function of input_ids (B, T).

They share one model's weights; ratios are taken against the PyTorch engine
that returns the same outputs (BASELINES).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import onnx
import onnxruntime as ort
import torch

from attnserve.client import ClientOptions, EncoderClient
from attnserve.model.config import ModelConfig
from attnserve.model.encoder import Encoder
from attnserve.service.errors import ProviderUnavailableError
from attnserve.service.runtime import CPU_EP, OrtRuntime, RuntimeOptions, session_options

Engine = Callable[[np.ndarray], object]
GRPC_MESSAGE_LIMIT = 256 * 1024 * 1024  # the benchmark server's --max-message-bytes

# engine -> the engine its ratio is taken against (PyTorch eager with the same outputs)
BASELINES = {
    "torch-eager": "torch-eager",
    "torch-compile": "torch-eager",
    "ort-cpu": "torch-eager",
    "ort-cpu-traced": "torch-eager",
    "ort-cpu-nospin": "torch-eager",
    "ort-cuda": "torch-eager",
    "torch-eager-emb": "torch-eager-emb",
    "ort-cpu-emb": "torch-eager-emb",
    "grpc-emb": "torch-eager-emb",
    "grpc-attn-f32-full": "torch-eager",
    "grpc-attn-f16-packed": "torch-eager",
    "matmul-only": "matmul-only",
    "ort-matmul-only": "ort-matmul-only",
}
DESCRIPTIONS = {
    "torch-eager": "PyTorch eager, embeddings + all attention weights",
    "torch-compile": "torch.compile(dynamic=True) of the same model",
    "ort-cpu": "ONNX Runtime CPU, the served full graph (model_fused.onnx), server settings",
    "ort-cpu-traced": "the same on model.onnx (attention op by op, as traced from PyTorch)",
    "ort-cpu-nospin": "the same with intra-op spinning off (workers sleep between operators)",
    "ort-cuda": "ONNX Runtime CUDA, model.onnx (only where a GPU works)",
    "torch-eager-emb": "PyTorch eager, embeddings only (fused SDPA)",
    "ort-cpu-emb": "ONNX Runtime CPU, model_embeddings.onnx (fused Attention op)",
    "grpc-emb": "gRPC Encode against a server process, embeddings only",
    "grpc-attn-f32-full": "gRPC Encode, all attention float32 full, decoded by the client",
    "grpc-attn-f16-packed": "gRPC Encode, all attention float16 causal-packed, decoded",
    "matmul-only": "only the model's matrix products at its shapes (torch): a floor",
    "ort-matmul-only": "the same products, each one MatMul node of ONNX Runtime: ORT's own floor",
}
FLOORS = {"matmul-only": "--", "ort-matmul-only": ":"}  # floor -> its line style in plots


DEFAULT_ENGINES = [
    "torch-eager",
    "torch-compile",
    "ort-cpu",
    "ort-cpu-traced",
    "ort-cpu-nospin",
    "ort-cuda",
    "torch-eager-emb",
    "ort-cpu-emb",
    "grpc-emb",
    "grpc-attn-f32-full",
    "grpc-attn-f16-packed",
    "matmul-only",
    "ort-matmul-only",
]


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


class TooLarge(Exception):
    """The cell's answer would not fit the benchmark server's message limit."""


def _grpc_engine(client: EncoderClient, **options) -> Engine:
    def run(ids: np.ndarray) -> object:
        try:
            return client.encode(list(ids), **options)
        except grpc.RpcError as exc:  # the server refuses answers over its message limit
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise TooLarge(exc.details().split(";")[0]) from exc
            raise

    return run


def build_engines(
    model: Encoder, model_dir: Path, names: list[str], grpc_address: str | None, log
) -> tuple[dict[str, Engine], dict[str, str]]:
    """The engines asked for that work here, and why the others do not."""
    engines: dict[str, Engine] = {}
    unavailable: dict[str, str] = {}

    def torch_run(module, need_weights: bool = True) -> Engine:
        def run(ids: np.ndarray) -> object:
            with torch.inference_mode():
                return module(torch.from_numpy(ids), need_weights=need_weights)

        return run

    for name in names:
        if name == "torch-eager":
            engines[name] = torch_run(model)
        elif name == "torch-eager-emb":
            engines[name] = torch_run(model, need_weights=False)
        elif name == "torch-compile":
            try:
                start = time.perf_counter()
                compiled = torch.compile(model, dynamic=True)
                torch_run(compiled)(np.zeros((1, 8), dtype=np.int64))
                log(f"torch.compile: compiled in {time.perf_counter() - start:.1f}s")
                engines[name] = torch_run(compiled)
            except Exception as exc:  # no compiler, unsupported op...: report, go on
                unavailable[name] = f"torch.compile failed: {type(exc).__name__}: {exc}"[:200]
        elif name in ("ort-cpu", "ort-cpu-emb", "ort-cpu-nospin", "ort-cpu-traced"):
            options = RuntimeOptions(
                provider="cpu",
                intra_op_spinning=name != "ort-cpu-nospin",
                fused_attention=name != "ort-cpu-traced",
            )
            runtime = OrtRuntime(model_dir, options)
            engines[name] = runtime.embed if name == "ort-cpu-emb" else runtime.run
        elif name == "ort-cuda":
            try:
                engines[name] = OrtRuntime(model_dir, RuntimeOptions(provider="cuda")).run
            except ProviderUnavailableError as exc:
                unavailable[name] = f"no working CUDA here ({str(exc)[:120]})"
        elif name.startswith("grpc-"):
            if grpc_address is None:
                unavailable[name] = "no server"
                continue
            client = EncoderClient(
                grpc_address, ClientOptions(timeout_s=600, max_message_bytes=GRPC_MESSAGE_LIMIT)
            )
            variant = {
                "grpc-emb": {},
                "grpc-attn-f32-full": {"attention": True},
                "grpc-attn-f16-packed": {
                    "attention": True,
                    "attention_dtype": "float16",
                    "attention_layout": "causal-packed",
                },
            }[name]
            engines[name] = _grpc_engine(client, **variant)
        elif name == "matmul-only":
            engines[name] = matmul_only(model.config)
        elif name == "ort-matmul-only":
            engines[name] = ort_matmul_only(model.config)
        else:
            raise ValueError(f"unknown engine {name!r}; choose from {list(BASELINES)}")
    return engines, unavailable
