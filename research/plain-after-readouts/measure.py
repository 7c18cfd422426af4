"""A plain 8-token Encode against the server before the readouts (commit 7f71806), on one
SmolLM2-135M-shaped model directory, before and after this checkout's server has opened its
readouts sessions (residual stream, lens, attribution). Three alternating runs of each.

    PYTHONPATH=. .venv/bin/python research/plain-after-readouts/measure.py
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from attnserve.bench.timing import p50_ms, repeated
from attnserve.client import ClientOptions, EncoderClient
from attnserve.service.process import spawn_server
from perf.hf_checkpoints import SMOLLM2_135M, build_checkpoint
from perf.sources import environment, sources_of

REF = "7f71806"  # the last commit before the readouts reached the transports


def compare(before: EncoderClient, after: EncoderClient, ids: list[int], label: str) -> None:
    for attempt in range(3):
        calls = {
            "before": functools.partial(before.encode, [ids]),
            "after": functools.partial(after.encode, [ids]),
        }
        times = repeated(calls, 60)
        old, new = p50_ms(times["before"]), p50_ms(times["after"])
        print(
            f"{label}, run {attempt}: {REF} {old:.2f} ms, this checkout {new:.2f} ms, "
            f"ratio {new / old:.3f}",
            flush=True,
        )


def main() -> None:
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory())).resolve()
        build_checkpoint("llama", work / "hf", perturb=0.0, **SMOLLM2_135M)
        command = [sys.executable, "-m", "attnserve", "export", "--from-hf", str(work / "hf")]
        command += ["--out", str(work / "model"), "--max-seq-len", "512"]
        subprocess.run(command, check=True, capture_output=True)
        now = spawn_server(work / "model", "--provider", "cpu")
        stack.callback(now.process.wait, 60)
        stack.callback(now.process.terminate)
        src = stack.enter_context(sources_of(REF))
        old = spawn_server(work / "model", "--provider", "cpu", cwd=src, env=environment(src))
        stack.callback(old.process.wait, 60)
        stack.callback(old.process.terminate)
        before = stack.enter_context(EncoderClient(old.address, ClientOptions(timeout_s=300)))
        after = stack.enter_context(EncoderClient(now.address, ClientOptions(timeout_s=300)))
        ids = np.random.default_rng(0).integers(0, 49152, size=8).tolist()
        compare(before, after, ids, "readouts sessions closed")
        last = {"positions": [-1]}
        after.encode(
            [ids], logit_lens=last, hidden_states=last, attribution={**last, "target_ids": [42]}
        )
        compare(before, after, ids, "readouts sessions open")


if __name__ == "__main__":
    main()
