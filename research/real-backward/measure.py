"""Does the model's real backward (softmax, GELU, the norms' own scales: nothing frozen)
export to ONNX Runtime from the model code? torch.func.vjp traced by make_fx into aten ops,
then the dynamo exporter on that graph. Gemma 2's layout (sandwich norms, GQA, soft-caps).

    .venv/bin/python research/real-backward/measure.py [T]

The metric: the logit difference of two tokens after the last position; the gradients: at
every layer's resid_pre (what attribution patching multiplies by clean - corrupted),
against torch autograd on the same model, and the time of each.
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
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from attnserve.model.config import ModelConfig
from attnserve.model.encoder import build_encoder

warnings.simplefilter("ignore")
T = int(sys.argv[1]) if len(sys.argv) > 1 else 16
config = ModelConfig(
    n_layers=4, n_heads=8, n_kv_heads=4, d_model=256, d_ff=1024, max_seq_len=512,
    vocab_size=2048, norm="rmsnorm_plus_one", norm_placement="sandwich", positions="rotary",
    mlp="gated", activation="gelu_tanh", attention_softcap=50.0, logit_softcap=30.0,
)  # fmt: skip
model = build_encoder(config, seed=0)


class Metric(nn.Module):
    """logit(answer) - logit(contrast) after the last position, deltas (L, B, T, D) added to
    each block's input (zero: the gradient there is the gradient at resid_pre)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids, deltas, answer, contrast):
        hooks = [
            block.register_forward_pre_hook(lambda _m, args, d=d: (args[0] + d, *args[1:]))
            for block, d in zip(self.model.blocks, deltas.unbind(0), strict=True)
        ]
        try:
            logits = self.model.logits(ids)[:, -1]  # (B, V)
        finally:
            for hook in hooks:
                hook.remove()
        rows = torch.arange(len(ids))
        return (logits[rows, answer] - logits[rows, contrast]).sum()


metric = Metric().eval()
# the buffers (rotary tables) are inputs too: make_fx traces what it is given
params = {k: v.detach() for k, v in [*metric.named_parameters(), *metric.named_buffers()]}


def grads(params, ids, deltas, answer, contrast):
    def f(deltas):
        return torch.func.functional_call(metric, params, (ids, deltas, answer, contrast))

    _, pull = torch.func.vjp(f, deltas)
    return pull(torch.ones(()))[0]


def main() -> None:
    ids = torch.randint(3, config.vocab_size, (1, T))
    deltas = torch.zeros(config.n_layers, 1, T, config.d_model)
    answer, contrast = torch.tensor([5]), torch.tensor([9])
    start = time.perf_counter()
    graph = make_fx(grads, tracing_mode="symbolic")(params, ids, deltas, answer, contrast)
    print(f"make_fx: {time.perf_counter() - start:.1f} s, {len(graph.graph.nodes)} nodes")

    class Exported(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for i, value in enumerate(params.values()):
                self.register_buffer(f"p{i}", value)

        def forward(self, ids, deltas, answer, contrast):
            given = {k: getattr(self, f"p{i}") for i, k in enumerate(params)}
            return graph(given, ids, deltas, answer, contrast)

    start = time.perf_counter()
    Tdim = torch.export.Dim("T", min=2, max=config.max_seq_len)
    program = torch.onnx.export(
        Exported(), (ids, deltas, answer, contrast), dynamo=True, verbose=False,
        dynamic_shapes=({1: Tdim}, {2: Tdim}, None, None),
    )  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "backward.onnx"
    program.save(str(path))
    ops = sorted({node.op_type for node in program.model_proto.graph.node})
    print(f"exported: {time.perf_counter() - start:.1f} s; ops: {' '.join(ops)}")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    # the exported graph keeps T, its trace's length (README)
    feed = dict(
        zip(names, (ids.numpy(), deltas.numpy(), answer.numpy(), contrast.numpy()), strict=True)
    )
    got = session.run(None, feed)[0]
    want = grads(params, ids, deltas, answer, contrast).numpy()
    timings = {}
    for name, run in (("ort", lambda: session.run(None, feed)),
                      ("torch", lambda: grads(params, ids, deltas, answer, contrast))):  # fmt: skip
        run()
        start = time.perf_counter()
        for _ in range(5):
            run()
        timings[name] = (time.perf_counter() - start) / 5 * 1e3
    error = np.abs(got - want).max() / np.abs(want).max()
    print(
        f"T={T}: max |ort - torch| / max |torch| = {error:.1e}; "
        f"ORT {timings['ort']:.1f} ms, torch autograd {timings['torch']:.1f} ms"
    )


if __name__ == "__main__":
    main()
