"""Where a saturated server's threads spend their time: py-spy's raw samples of every thread
of the server, idle ones included, while the peers benchmark's closed loop (64 in flight,
lengths uniform in 8..512) runs against it; then how many of the samples were in ONNX
Runtime's run, as a share of the machine's cores.

    PYTHONPATH=. .venv/bin/python research/per-request-path/saturated_profile.py
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from profile_server import PY_SPY, summary  # beside this script: on sys.path when it runs

from attnserve.bench.default_model import model_dir_or_default
from attnserve.bench.load import LoadGenerator, Record, RequestKind
from attnserve.client import keep_freed_heap
from attnserve.service.process import ServerProcess, spawn_server

SECONDS, RATE_HZ, CONCURRENCY = 8, 200, 64
MIX = [RequestKind(t) for t in range(8, 513)]


@contextlib.contextmanager
def saturated_server(*flags: str) -> Iterator[ServerProcess]:
    """The default model served on the CPU (`flags` added), warmed up by 2 s of the closed
    loop, with this process's heap kept as the peers benchmark's client keeps it."""
    keep_freed_heap()
    with model_dir_or_default(None, lambda _: None) as model_dir:
        server = spawn_server(model_dir, "--provider", "cpu", "--max-queue", "1024", *flags)
        try:
            closed_loop(server.address, 2.0, seed=1)  # other draws than the measured loop's
            yield server
        finally:
            server.process.terminate()
            server.process.wait(30)


def closed_loop(address: str, seconds: float, seed: int = 0) -> tuple[list[Record], float]:
    """`CONCURRENCY` in flight for `seconds`: every request's record, and the elapsed time."""
    load = LoadGenerator(address, MIX, seed=seed)
    return asyncio.run(load.closed_loop(CONCURRENCY, seconds, progress=False))


def main() -> None:
    with saturated_server() as server, tempfile.TemporaryDirectory() as scratch:
        raw = Path(scratch) / "server.raw"
        spy = [PY_SPY, "record", "--pid", str(server.process.pid), "--rate", str(RATE_HZ)]
        spy += ["--duration", str(SECONDS), "--threads", "--idle", "--nonblocking"]
        spy += ["--format", "raw", "-o", str(raw)]
        recorder = subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        records, elapsed = closed_loop(server.address, SECONDS + 2.0)
        recorder.wait()
        print(f"{len(records) / elapsed:.1f} requests/s")
        in_ort = sum(
            int(line.rsplit(" ", 1)[1])
            for line in raw.read_text().splitlines()
            if "Session.run" in line
        )
        cores = len(os.sched_getaffinity(0))
        print(f"ONNX Runtime's run: {in_ort / (SECONDS * RATE_HZ * cores):.0%} of {cores} cores")
        summary(raw, 12)


if __name__ == "__main__":
    main()
