"""Can the real backward's graph keep T dynamic? Two ways tried on measure.py's model:

1. make_fx(tracing_mode="symbolic") of torch.func.vjp, then torch.export with T a Dim:
   "Constraints violated (T)": the trace itself fixed T (a guard Eq(T, 16) added in the
   qkv projection's decomposition, attention.py's `self.qkv(x).split`), and 243 nodes hold
   the literal 16 (views such as [1, 16, 8, 32]).
2. torch.export of a module whose forward calls torch.func.vjp: non-strict fails ("Cannot
   access data pointer of Tensor that doesn't have storage": functorch under fake
   tensors), strict fails at the block pre-hooks the deltas enter by (dynamo cannot
   trace register_forward_pre_hook inside a forward).

    .venv/bin/python research/real-backward/dynamic_length.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.fx.experimental.proxy_tensor import make_fx

sys.argv = [sys.argv[0], "16"]
sys.path.insert(0, str(Path(__file__).parent))
from measure import config, grads, metric, params  # noqa: E402 (after T is set)

T = 16
ids = torch.randint(3, config.vocab_size, (1, T))
deltas = torch.zeros(config.n_layers, 1, T, config.d_model)
answer, contrast = torch.tensor([5]), torch.tensor([9])
length = torch.export.Dim("T", min=2, max=config.max_seq_len)
dynamic = ({1: length}, {2: length}, None, None)

graph = make_fx(grads, tracing_mode="symbolic")(params, ids, deltas, answer, contrast)
fixed = sum(
    any(a == T or (isinstance(a, list | tuple) and T in a) for a in node.args)
    for node in graph.graph.nodes
)
print(f"1. make_fx symbolic: {fixed} of {len(graph.graph.nodes)} nodes hold the literal {T}")


class Given(torch.nn.Module):
    def forward(self, ids, deltas, answer, contrast):
        return graph(params, ids, deltas, answer, contrast)


class Vjp(torch.nn.Module):
    def forward(self, ids, deltas, answer, contrast):
        _, pull = torch.func.vjp(lambda d: metric(ids, d, answer, contrast), deltas)
        return pull(torch.ones(()))[0]


for name, module, strict in (("1. its graph", Given(), False), ("2. non-strict", Vjp(), False),
                             ("2. strict", Vjp(), True)):  # fmt: skip
    try:
        torch.export.export(module, (ids, deltas, answer, contrast), dynamic_shapes=dynamic,
                            strict=strict)  # fmt: skip
        print(f"{name}: exported with T dynamic")
    except Exception as exc:  # what each way fails with is the finding
        print(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
