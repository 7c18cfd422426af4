"""Where a served request's time goes, by Python function: py-spy's raw samples of the
server while one client sends the same request back to back, summed per frame.

    PYTHONPATH=. .venv/bin/python research/per-request-path/profile_server.py [T] [--attention]

Prints the p50 of the calls, then the frames with the most samples, inclusive and by
themselves (compiled code, gRPC's core and ONNX Runtime, counts under the Python frame
that called it). py-spy needs the right to ptrace the server.
"""

from __future__ import annotations

import asyncio
import collections
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from attnserve.bench.default_model import model_dir_or_default
from attnserve.client import AsyncEncoderClient
from attnserve.service.process import spawn_server

PY_SPY = str(Path(sys.executable).with_name("py-spy"))  # the venv's, on PATH or not
SECONDS, RATE_HZ = 8, 500


async def record(address: str, pid: int, seq_len: int, options: dict, raw: Path) -> None:
    client = AsyncEncoderClient(address)
    ids = np.random.default_rng(0).integers(0, 256, size=seq_len).tolist()
    n = 20 if options else 1000
    for _ in range(n // 5):
        await client.encode([ids], **options)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        await client.encode([ids], **options)
        times.append(time.perf_counter() - start)
    print(f"T = {seq_len} {options or ''}: p50 {np.median(times) * 1e3:.3f} ms")
    spy = [PY_SPY, "record", "--pid", str(pid), "--rate", str(RATE_HZ), "--duration"]
    spy += [str(SECONDS), "--threads", "--nonblocking", "--format", "raw", "-o", str(raw)]
    recorder = subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while recorder.poll() is None:
        await client.encode([ids], **options)


def summary(raw: Path, top: int = 40) -> None:
    inclusive, itself = collections.Counter(), collections.Counter()
    for line in raw.read_text().splitlines():
        stack, count = line.rsplit(" ", 1)
        frames = [re.sub(r"\(/.*?(site-packages|main)/", "(", f) for f in stack.split(";")[1:]]
        for frame in set(frames):
            inclusive[frame] += int(count)
        if frames:
            itself[frames[-1]] += int(count)
    for title, counter in (("inclusive", inclusive), ("by itself", itself)):
        print(f"--- samples, {title}")
        for frame, count in counter.most_common(top):
            print(f"{count:6d} {frame[:140]}")


def main() -> None:
    seq_len = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 8
    options = {"attention": True} if "--attention" in sys.argv else {}
    with (
        model_dir_or_default(None, lambda _: None) as model_dir,
        tempfile.TemporaryDirectory() as t,
    ):
        server = spawn_server(model_dir, "--provider", "cpu")
        try:
            raw = Path(t) / "server.raw"
            asyncio.run(record(server.address, server.process.pid, seq_len, options, raw))
            summary(raw)
        finally:
            server.process.terminate()
            server.process.wait(30)


if __name__ == "__main__":
    main()
