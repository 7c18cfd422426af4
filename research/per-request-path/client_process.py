"""Does the process attnserve's client runs in move its short calls? The peers benchmark
drives each peer from a tritonclient process of its own, and attnserve from its own
process, which also holds ONNX Runtime's session for the floor and runs it after each
case. Here one server, one request at a time of 8 and 32 tokens, in alternating turns of
40 calls: from this process, holding and running the floor's session as the benchmark
does, and from a process with only the client.

    PYTHONPATH=. .venv/bin/python research/per-request-path/client_process.py [BLOCKS]
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
from saturated_profile import saturated_server  # beside this script

from attnserve.bench.default_model import model_dir_or_default
from attnserve.client import AsyncEncoderClient
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from perf.full_maps import encode_ms

LENGTHS, CALLS = (8, 32), 40

# The client alone: a turn of `calls` calls of `seq_len` tokens per line read, their ms out.
LEAN_CLIENT = """
import asyncio, json, sys
from attnserve.client import AsyncEncoderClient, keep_freed_heap
from perf.full_maps import encode_ms

async def main():
    client = AsyncEncoderClient(sys.argv[1])
    for line in sys.stdin:
        seq_len, calls = json.loads(line)
        print(json.dumps(await encode_ms(client, seq_len, calls)), flush=True)

keep_freed_heap()
asyncio.run(main())
"""


def main() -> None:
    blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    times = {(where, t): [] for where in ("benchmark's", "lean") for t in LENGTHS}
    with saturated_server() as server, model_dir_or_default(None, lambda _: None) as model_dir:
        runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
        command = [sys.executable, "-c", LEAN_CLIENT, server.address]
        lean = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        with asyncio.Runner() as runner:
            client = AsyncEncoderClient(server.address)
            for block in range(blocks):
                for seq_len in LENGTHS:
                    order = ("benchmark's", "lean")[:: 1 if block % 2 == 0 else -1]
                    for where in order:
                        if where == "lean":
                            assert lean.stdin and lean.stdout
                            lean.stdin.write(json.dumps([seq_len, CALLS]) + "\n")
                            lean.stdin.flush()
                            ms = json.loads(lean.stdout.readline())
                        else:
                            ms = runner.run(encode_ms(client, seq_len, CALLS))
                        times[where, seq_len] += ms
                    ids = np.random.default_rng(seq_len).integers(0, 256, size=(1, seq_len))
                    for _ in range(CALLS):  # the floor's runs, as the benchmark makes them
                        runtime.embed(ids)
            runner.run(client.close())
        lean.stdin.close()
        lean.wait(30)
    for seq_len in LENGTHS:
        ours, lean_ms = np.median(times["benchmark's", seq_len]), np.median(times["lean", seq_len])
        print(
            f"T = {seq_len}: p50 from the benchmark's process {ours:.3f} ms, "
            f"from a lean one {lean_ms:.3f} ms ({lean_ms / ours:.3f}x)"
        )


if __name__ == "__main__":
    main()
