"""A plain Encode against the server before features were served (commit bba3bb5), on one
SmolLM2-135M-shaped model directory holding a 4k SAE on its last layer, at T = 8 and 128:
three alternating runs of 60 calls a side, then three more after this checkout's server
has answered a features request.

    PYTHONPATH=. .venv/bin/python research/plain-after-features/measure.py
"""

from __future__ import annotations

import contextlib
import functools
import sys
import tempfile
from pathlib import Path

import numpy as np

from attnserve.bench.timing import p50_ms, repeated
from attnserve.client import ClientOptions, EncoderClient
from attnserve.service.process import spawn_server
from perf.features import BEFORE_FEATURES, add, import_model, write_sae
from perf.hf_checkpoints import SMOLLM2_135M
from perf.sources import environment, sources_of


def compare(before: EncoderClient, after: EncoderClient, label: str) -> None:
    rng = np.random.default_rng(0)
    for t in (8, 128):
        ids = rng.integers(0, SMOLLM2_135M["vocab_size"], size=t).tolist()
        for attempt in range(3):
            calls = {
                "before": functools.partial(before.encode, [ids]),
                "after": functools.partial(after.encode, [ids]),
            }
            times = repeated(calls, 60)
            old, new = p50_ms(times["before"]), p50_ms(times["after"])
            print(
                f"{label}, T = {t}, run {attempt}: {BEFORE_FEATURES} {old:.2f} ms, "
                f"this checkout {new:.2f} ms, ratio {new / old:.3f}",
                flush=True,
            )


def main() -> None:
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory())).resolve()
        model = import_model(work, "llama", SMOLLM2_135M, "SmolLM2-135M", print)
        hook = f"blocks.{SMOLLM2_135M['num_hidden_layers'] - 1}.hook_resid_post"
        add(model, write_sae(work / "sae", SMOLLM2_135M["hidden_size"], 4096, hook, 0), "sae")
        now = spawn_server(model, "--provider", "cpu")
        stack.callback(now.process.wait, 60)
        stack.callback(now.process.terminate)
        src = stack.enter_context(sources_of(BEFORE_FEATURES))
        old = spawn_server(model, "--provider", "cpu", cwd=src, env=environment(src))
        stack.callback(old.process.wait, 60)
        stack.callback(old.process.terminate)
        before = stack.enter_context(EncoderClient(old.address, ClientOptions(timeout_s=300)))
        after = stack.enter_context(EncoderClient(now.address, ClientOptions(timeout_s=300)))
        compare(before, after, "features not asked yet")
        after.encode([[1, 2, 3]], features={"saes": ["sae"]})
        compare(before, after, "after a features request")


if __name__ == "__main__":
    sys.exit(main())
