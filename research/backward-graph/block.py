"""The same question for a whole block (attention and MLP, sandwich norms, GQA: Gemma 2's
layout): frozen as circuit-tracer's replacement model freezes it (the prompt's pattern, each
norm's scale, the MLP's output a constant), is its backward traced from the model code, and
is it the transpose of its forward? Checked without autograd: the frozen block is linear in
its input, so for any v and g, <g, f(v) - f(0)> must equal <backward(g), v>.

    .venv/bin/python research/backward-graph/block.py
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from measure import Primitives  # measure.py, beside this file
from torch import nn

from attnserve.model.config import ModelConfig
from attnserve.model.hook_points import hooked
from attnserve.model.layers import MLP, Block
from attnserve.model.norms import RMSNorm, norm_scale

CONFIG = ModelConfig(
    n_layers=1, n_heads=4, n_kv_heads=2, d_head=16, d_model=48, d_ff=96, max_seq_len=32,
    positions="rotary", norm="rmsnorm_plus_one", norm_placement="sandwich", mlp="gated",
    activation="gelu_tanh",
)  # fmt: skip
T = 7


@contextmanager
def frozen_norms(scales: dict[RMSNorm, torch.Tensor]) -> Iterator[None]:
    """Each norm of `scales` divides by its given scale (B, T, 1), not x's own."""
    forward = RMSNorm.forward

    def frozen(self: RMSNorm, x: torch.Tensor) -> torch.Tensor:
        return x / scales[self] * (self.offset + self.weight)

    RMSNorm.forward = frozen  # type: ignore[method-assign]
    try:
        yield
    finally:
        RMSNorm.forward = forward  # type: ignore[method-assign]


@contextmanager
def constant_mlp(output: torch.Tensor) -> Iterator[None]:
    """The MLP writes `output` whatever it reads (a transcoder's reconstruction and error,
    frozen): no gradient goes through it."""
    forward = MLP.forward
    MLP.forward = lambda self, x: output  # type: ignore[method-assign]
    try:
        yield
    finally:
        MLP.forward = forward  # type: ignore[method-assign]


class Frozen(nn.Module):
    """The block run on x with the prompt's pattern, norm scales and MLP output."""

    def __init__(self, block: Block, prompt: torch.Tensor) -> None:
        super().__init__()
        self.block = block
        with torch.no_grad(), hooked(block, {"blocks.0.attn.hook_pattern": self._keep}):
            self.scales = self._scales(prompt)
            self.mlp_out = torch.randn(1, T, CONFIG.d_model)  # any constant will do
        self.norms = [m for m in block.modules() if isinstance(m, RMSNorm)]

    def _keep(self, pattern: torch.Tensor) -> None:
        self.pattern = pattern

    def _scales(self, prompt: torch.Tensor) -> dict[RMSNorm, torch.Tensor]:
        scales: dict[RMSNorm, torch.Tensor] = {}
        handles = [
            m.register_forward_pre_hook(
                lambda m, args: scales.__setitem__(m, norm_scale(m, args[0]))
            )
            for m in self.block.modules()
            if isinstance(m, RMSNorm)
        ]
        self.block(prompt)
        for handle in handles:
            handle.remove()
        return scales

    def run(
        self, x: torch.Tensor, pattern: torch.Tensor, scales: list[torch.Tensor]
    ) -> torch.Tensor:
        frozen = {
            "blocks.0.attn.hook_q": torch.Tensor.detach,
            "blocks.0.attn.hook_k": torch.Tensor.detach,
            "blocks.0.attn.hook_pattern": lambda _: pattern.expand(len(x), -1, -1, -1),
        }
        given = {
            norm: scale.expand(len(x), -1, -1)
            for norm, scale in zip(self.norms, scales, strict=True)
        }
        with hooked(self.block, frozen), frozen_norms(given), constant_mlp(self.mlp_out):
            return self.block(x)[0]


class Backward(nn.Module):
    def __init__(self, frozen: Frozen) -> None:
        super().__init__()
        self.frozen = frozen

    def forward(
        self, grads: torch.Tensor, pattern: torch.Tensor, *scales: torch.Tensor
    ) -> torch.Tensor:
        x = torch.zeros_like(grads, requires_grad=True)
        with torch.enable_grad(), Primitives():
            y = self.frozen.run(x, pattern, list(scales))
            return torch.autograd.grad((y * grads).sum(), x)[0]


def main() -> None:
    torch.manual_seed(0)
    block = Block(CONFIG).eval()
    for p in block.parameters():
        p.data.normal_(0, 0.3)
    prompt = 10 * torch.randn(1, T, CONFIG.d_model)
    frozen = Frozen(block, prompt)
    pattern, scales = (
        frozen.pattern[0],
        [frozen.scales[n][0] for n in frozen.norms],
    )  # (H, T, T), (T, 1)
    grads = torch.randn(5, T, CONFIG.d_model)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = Path(tmp) / "block_backward.onnx"
        program = torch.onnx.export(
            Backward(frozen), (grads, pattern, *scales), dynamo=True, verbose=False
        )
        assert program is not None
        program.save(str(path))
        ops = sorted({node.op_type for node in program.model_proto.graph.node})
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        got = session.run(
            None, dict(zip(names, (t.numpy() for t in (grads, pattern, *scales)), strict=True))
        )[0]
    v = torch.randn(5, T, CONFIG.d_model)
    with torch.no_grad():
        difference = frozen.run(v, pattern[None], [s[None] for s in scales]) - frozen.run(
            torch.zeros_like(v), pattern[None], [s[None] for s in scales]
        )
    left = (grads * difference).sum(dim=(1, 2)).numpy()  # <g, f(v) - f(0)> per row
    right = (torch.from_numpy(got) * v).sum(dim=(1, 2)).numpy()  # <backward(g), v>
    print(f"the graph's ops: {', '.join(ops)}")
    print(f"<g, f(v) - f(0)> against <backward(g), v>, largest relative gap: "
          f"{(np.abs(left - right) / np.abs(left).max()).max():.2g}")  # fmt: skip


if __name__ == "__main__":
    main()
