"""What decoding costs in the client's own process: every attention weight at 512 tokens in
float32, in float16 causal-packed unpacked by the client, and kept packed
(unpack_attention=False), in alternating blocks with ORT's run of the full graph in the
same process between them (as the peers benchmark does). Prints each kind's p50 beside the
client process's page faults and system time per call.

    PYTHONPATH=. .venv/bin/python research/per-request-path/client_side.py [--keep-freed-heap]

--keep-freed-heap: the client's process keeps its freed heap first (the server's policy,
attnserve.client.keep_freed_heap).
"""

from __future__ import annotations

import asyncio
import resource
import sys
import time

import numpy as np

from attnserve.bench.default_model import model_dir_or_default
from attnserve.client import AsyncEncoderClient, keep_freed_heap
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from attnserve.service.process import spawn_server
from perf.full_maps import F16_KEPT, F16_PACKED, F32, MAP_OPTIONS, runtime_ms

T, BLOCKS, CALLS = 512, 4, 3


async def measure(address: str, runtime: OrtRuntime) -> None:
    client = AsyncEncoderClient(address)
    ids = [i % 256 for i in range(T)]
    ms: dict[str, list[float]] = {kind: [] for kind in (F32, F16_PACKED, F16_KEPT)}
    faults = dict.fromkeys(ms, 0)
    system_s = dict.fromkeys(ms, 0.0)
    for _ in range(BLOCKS):
        for kind in ms:
            before = resource.getrusage(resource.RUSAGE_SELF)
            for _ in range(CALLS):
                start = time.perf_counter()
                await client.encode([ids], **MAP_OPTIONS[kind])
                ms[kind].append((time.perf_counter() - start) * 1e3)
            after = resource.getrusage(resource.RUSAGE_SELF)
            faults[kind] += after.ru_minflt - before.ru_minflt
            system_s[kind] += after.ru_stime - before.ru_stime
            runtime_ms(runtime, T, CALLS)
    await client.close()
    n = BLOCKS * CALLS
    for kind, times in ms.items():
        print(
            f"{kind:42s} p50 {np.median(times):6.1f} ms   client: {faults[kind] / n:6.0f} "
            f"page faults, {system_s[kind] / n * 1e3:5.1f} ms of system time per call"
        )


def main() -> None:
    if "--keep-freed-heap" in sys.argv[1:]:
        keep_freed_heap()
    with model_dir_or_default(None, lambda _: None) as model_dir:
        server = spawn_server(model_dir, "--provider", "cpu")
        try:
            runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
            asyncio.run(measure(server.address, runtime))
        finally:
            server.process.terminate()
            server.process.wait(30)


if __name__ == "__main__":
    main()
