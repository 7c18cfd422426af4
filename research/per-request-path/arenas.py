"""The same server with glibc's per-thread malloc arenas, with one arena, and with every
lone request inline on the event loop (the main thread's arena): p50 and the server's page
faults per call, one request at a time in alternating blocks. The second server gets
MALLOC_ARENA_MAX=1 in its environment; at a commit whose server sets one arena itself
(service/core/memory.py), the first two are the same server and their ratio reads 1.

    PYTHONPATH=. .venv/bin/python research/per-request-path/arenas.py
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from attnserve.bench.default_model import model_dir_or_default
from attnserve.client import AsyncEncoderClient, ClientOptions
from attnserve.service.process import spawn_server
from perf.full_maps import F16_KEPT, F16_PACKED, F32, MAP_OPTIONS, encode_ms

VARIANTS = {  # name: (flags, environment)
    "arenas per thread": ([], {}),
    "one arena": ([], {"MALLOC_ARENA_MAX": "1"}),
    "inline up to 50 ms": (["--inline-max-ms=50"], {}),
}
REQUESTS = (  # (name, tokens, options, calls per block)
    ("T=8", 8, {}, 100),
    ("T=512", 512, {}, 10),
    ("T=512, " + F16_PACKED, 512, MAP_OPTIONS[F16_PACKED], 10),
    ("T=512, " + F16_KEPT, 512, MAP_OPTIONS[F16_KEPT], 10),
    ("T=512, " + F32, 512, MAP_OPTIONS[F32], 5),
)
BLOCKS = 6  # the first warms up


def minor_faults(pid: int) -> int:
    """The process's minor page faults so far (/proc/PID/stat, field 10)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


@contextlib.contextmanager
def serve(model_dir: Path, flags: list[str], env: dict) -> Iterator[tuple[str, int]]:
    server = spawn_server(model_dir, "--provider", "cpu", *flags, env={**os.environ, **env})
    try:
        yield server.address, server.process.pid
    finally:
        server.process.terminate()
        server.process.wait(30)


async def measure(servers: dict[str, tuple[str, int]]) -> dict:
    clients = {
        name: AsyncEncoderClient(a, ClientOptions(timeout_s=120))
        for name, (a, _) in servers.items()
    }
    results = {name: {r[0]: {"ms": [], "faults": []} for r in REQUESTS} for name in servers}
    for block in range(BLOCKS):
        for request, tokens, options, n in REQUESTS:
            for name, client in clients.items():
                pid = servers[name][1]
                before = minor_faults(pid)
                ms = await encode_ms(client, tokens, n, **options)
                if block:
                    results[name][request]["ms"] += ms
                    results[name][request]["faults"].append((minor_faults(pid) - before) / n)
    for client in clients.values():
        await client.close()
    return results


def main() -> None:
    with model_dir_or_default(None, lambda _: None) as model_dir, contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(serve(model_dir, *v)) for name, v in VARIANTS.items()}
        results = asyncio.run(measure(servers))
    base = next(iter(VARIANTS))
    for request, *_ in REQUESTS:
        p50 = {name: float(np.median(results[name][request]["ms"])) for name in VARIANTS}
        print(f"{request}: " + ", ".join(
            f"{name} {p50[name]:.2f} ms ({p50[name] / p50[base]:.2f}x), "
            f"{np.median(results[name][request]['faults']):,.0f} faults per call"
            for name in VARIANTS
        ))  # fmt: skip


if __name__ == "__main__":
    main()
