"""The per-request translation and planning step in-process, at whichever commit's code runs
it (the core's own request types since issue 67; attnserve.v1's messages in the core before).

    PYTHONPATH=SOURCES .venv/bin/python research/core-types-cost/plan_cost.py
"""

import timeit

from attnserve.client import build_request
from attnserve.model.config import ModelConfig
from attnserve.model.tokenizer import ByteTokenizer

try:
    from attnserve.service.core.plan import plan_request
    from attnserve.service.core.view import ModelView
    from attnserve.service.v1.options import inputs_of, options_of

    def plan(r, c, t):
        return plan_request(inputs_of(r), options_of(r.options), ModelView(c, t))
except ImportError:
    from attnserve.service.core.plan import inputs_of, plan_request

    def plan(r, c, t):
        return plan_request(inputs_of(r), r.options, c, t)


c = ModelConfig(n_layers=4, n_heads=8, d_model=256, d_ff=1024, max_seq_len=1024)
t = ByteTokenizer(c)
n = 20000
for name, r in (
    ("plain", build_request([list(range(1, 9))])),
    (
        "attention",
        build_request(
            [list(range(1, 9))], attention=True, layers=[0], attention_layout="causal-packed"
        ),
    ),
):
    us = min(timeit.repeat(lambda r=r: plan(r, c, t), number=n, repeat=5)) / n * 1e6
    print(f"{name}: {us:.2f} us")  # the fastest of five repeats
