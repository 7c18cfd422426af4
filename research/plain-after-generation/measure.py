"""A plain Encode against the server before generation (commit e2a94b1), on one
SmolLM2-135M-shaped model directory exported by this checkout: at 8 and 128 tokens, three
alternating runs of 60 calls a side, before and after this checkout's server has generated
a text (its decode graph's session open, no generation running).

    PYTHONPATH=. .venv/bin/python research/plain-after-generation/measure.py [REF]

REF (default e2a94b1): the commit the other server runs; HEAD measures the comparison's own
asymmetry (the same code both sides).
"""

from __future__ import annotations

import contextlib
import functools
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np

from attnserve.bench.timing import p50_ms, repeated
from attnserve.client import ClientOptions, EncoderClient
from attnserve.service.process import spawn_server
from perf.hf_checkpoints import SMOLLM2_135M, build_checkpoint
from perf.sources import environment, sources_of

REF = sys.argv[1] if len(sys.argv) > 1 else "e2a94b1"  # the last commit before generation


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
                f"{label}, T = {t}, run {attempt}: {REF} {old:.2f} ms, this checkout "
                f"{new:.2f} ms, ratio {new / old:.3f}",
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
        compare(before, after, "no generation yet")
        body = {"prompt": [1, 2, 3], "max_tokens": 8, "temperature": 0}
        url = f"http://127.0.0.1:{now.http_port}/v1/completions"
        httpx.post(url, json=body, timeout=300).raise_for_status()
        compare(before, after, "after a generation")


if __name__ == "__main__":
    main()
