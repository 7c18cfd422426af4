"""Can ONNX Runtime run the backward of a frozen attention layer, traced from the model code?

Attribution graphs (issue 85) need, for a batch of gradient rows injected after a layer,
their gradients at the layer's input with the attention pattern frozen: a linear map, whose
backward is its transpose. Here one attention sublayer of the model (model/layers.py
MultiHeadAttention, its pattern replaced through its hook point by the prompt's, frozen) is
differentiated with torch.autograd.grad inside a module's forward, and that module is
exported with the dynamo exporter: does the graph hold only the transposed map, does ONNX
Runtime match torch's autograd, and what does a batch of rows cost in each?

    .venv/bin/python research/backward-graph/measure.py [ROWS]
"""

from __future__ import annotations

import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from attnserve.model.config import ModelConfig
from attnserve.model.hook_points import hooked
from attnserve.model.layers import MultiHeadAttention

# gemma-2-2b's attention: 8 query heads and 4 key/value heads of 256, d_model 2304
CONFIG = ModelConfig(
    n_layers=1, n_heads=8, n_kv_heads=4, d_head=256, d_model=2304, d_ff=9216,
    max_seq_len=64, positions="rotary", norm="rmsnorm",
)  # fmt: skip
T = 16  # a 16-token prompt, as the target


class Primitives(TorchFunctionMode):
    """F.linear as a matmul plus its bias, and a batched matmul of more than 3 axes as bmm:
    torch.export traces autograd.grad through those, not through F.linear or a 4-D matmul
    ("a fake tensor in the exported program's constants", torch 2.13)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            y = torch.matmul(x, weight.transpose(0, 1))
            return y if bias is None else y + bias
        if func in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__):
            a, b = args
            if a.ndim > 3 or b.ndim > 3:
                batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
                a = a.expand(*batch, *a.shape[-2:]).reshape(-1, *a.shape[-2:])
                b = b.expand(*batch, *b.shape[-2:]).reshape(-1, *b.shape[-2:])
                return torch.bmm(a, b).view(*batch, a.shape[-2], b.shape[-1])
        return func(*args, **kwargs)


class FrozenBackward(nn.Module):
    """grads (B, T, D) after the layer -> their gradients at its input (B, T, D), the
    pattern (H, T, T) frozen: autograd.grad of the layer run at x = 0 on every row at once
    (linear, so any point gives the same map, and each row's output is its own input's)."""

    def __init__(self, attention: MultiHeadAttention) -> None:
        super().__init__()
        self.attention = attention

    def forward(self, grads: torch.Tensor, pattern: torch.Tensor) -> torch.Tensor:
        x = torch.zeros_like(grads, requires_grad=True)  # (B, T, D)
        # the pattern frozen (the prompt's), and the queries and keys left out of autograd
        # (they only made the pattern; the backward of their softmax would need its values)
        frozen = {
            "blocks.0.attn.hook_q": torch.Tensor.detach,
            "blocks.0.attn.hook_k": torch.Tensor.detach,
            "blocks.0.attn.hook_pattern": lambda _: pattern.expand(len(grads), -1, -1, -1),
        }
        with torch.enable_grad(), Primitives(), hooked(self.attention, frozen):
            y = self.attention(x)[0]  # (B, T, D)
            return torch.autograd.grad(y, x, grads)[0]


def timed(run, repeats: int = 5) -> float:
    """The fastest of `repeats` runs, in ms."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main(rows: int) -> None:
    torch.manual_seed(0)
    attention = MultiHeadAttention(CONFIG).eval()
    for p in attention.parameters():
        p.data.normal_(0, 0.02)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    pattern = torch.softmax(torch.randn(CONFIG.n_heads, T, T).masked_fill(causal, -1e9), -1)
    grads = torch.randn(rows, T, CONFIG.d_model)
    module = FrozenBackward(attention)
    want = module(grads, pattern).detach().numpy()
    # torch's own: the same rows through autograd of the layer with the pattern frozen
    rows_dim, seq = torch.export.Dim("rows", min=1), torch.export.Dim("seq", min=2, max=64)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = Path(tmp) / "backward.onnx"
        program = torch.onnx.export(
            module,
            (grads, pattern),
            dynamo=True,
            verbose=False,
            input_names=["grads", "pattern"],
            dynamic_shapes={"grads": {0: rows_dim, 1: seq}, "pattern": {1: seq, 2: seq}},
        )
        assert program is not None
        program.save(str(path))
        ops = sorted({node.op_type for node in program.model_proto.graph.node})
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {"grads": grads.numpy(), "pattern": pattern.numpy()}
        got = session.run(None, feeds)[0]
        onnx_ms = timed(lambda: session.run(None, feeds))
    torch_ms = timed(lambda: module(grads, pattern))
    scale = np.abs(want).max(axis=(1, 2), keepdims=True)
    print(f"the graph's ops: {', '.join(ops)}")
    print(f"largest difference over each row's largest: {(np.abs(got - want) / scale).max():.2g}")
    print(
        f"{rows} rows at T = {T}: ONNX Runtime {onnx_ms:.1f} ms, torch autograd {torch_ms:.1f} ms"
    )


if __name__ == "__main__":
    torch.set_num_threads(2)
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 64)
