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
import torch

from attnserve.client import ClientOptions, EncoderClient
from attnserve.model.encoder import Encoder
from attnserve.service.core.errors import ProviderUnavailableError
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions

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
}


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
]


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
        else:
            raise ValueError(f"unknown engine {name!r}; choose from {list(BASELINES)}")
    return engines, unavailable
