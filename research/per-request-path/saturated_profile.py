"""Where a saturated server's threads spend their time: py-spy's raw samples of every thread
of the server, idle ones included, while the peers benchmark's closed loop (64 in flight,
lengths uniform in 8..512) runs against it; then how many of the samples were in ONNX
Runtime's run, as a share of the machine's cores.

    PYTHONPATH=. .venv/bin/python research/per-request-path/saturated_profile.py
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from pathlib import Path

from profile_server import PY_SPY, summary  # beside this script: on sys.path when it runs

from attnserve.bench.default_model import model_dir_or_default
from attnserve.bench.load import LoadGenerator, RequestKind
from attnserve.client import keep_freed_heap
from attnserve.service.process import spawn_server

SECONDS, RATE_HZ, CONCURRENCY = 8, 200, 64
MIX = [RequestKind(t) for t in range(8, 513)]


def main() -> None:
    keep_freed_heap()  # as the peers benchmark's client
    with (
        model_dir_or_default(None, lambda _: None) as model_dir,
        tempfile.TemporaryDirectory() as scratch,
    ):
        server = spawn_server(model_dir, "--provider", "cpu", "--max-queue", "1024")
        try:
            raw = Path(scratch) / "server.raw"
            warm_up = LoadGenerator(server.address, MIX, seed=1)
            asyncio.run(warm_up.closed_loop(CONCURRENCY, 2.0, progress=False))
            spy = [PY_SPY, "record", "--pid", str(server.process.pid), "--rate", str(RATE_HZ)]
            spy += ["--duration", str(SECONDS), "--threads", "--idle", "--nonblocking"]
            spy += ["--format", "raw", "-o", str(raw)]
            recorder = subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            load = LoadGenerator(server.address, MIX, seed=0)
            records, elapsed = asyncio.run(
                load.closed_loop(CONCURRENCY, SECONDS + 2.0, progress=False)
            )
            recorder.wait()
            print(f"{len(records) / elapsed:.1f} requests/s")
            in_ort = sum(
                int(line.rsplit(" ", 1)[1])
                for line in raw.read_text().splitlines()
                if "Session.run" in line
            )
            cores = len(os.sched_getaffinity(0))
            share = in_ort / (SECONDS * RATE_HZ * cores)
            print(f"ONNX Runtime's run: {share:.0%} of {cores} cores")
            summary(raw, 12)
        finally:
            server.process.terminate()
            server.process.wait(30)


if __name__ == "__main__":
    main()
