"""attnserve's and KServe's CPU per short call, side by side: one request at a time of T
tokens, the two servers in alternating turns of N calls (attnserve through its client in
this process, KServe through the peers benchmark's tritonclient driver); per call, the CPU
of each server's event loop (its main thread), of its other threads together, and of its
client's process, and each server's p50.

    PYTHONPATH=. .venv/bin/python research/per-request-path/short_call_cpu.py [T] [N] [TURNS]
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable

import numpy as np
from saturated_cpu import own_seconds, thread_seconds  # beside this script

from attnserve.bench.default_model import model_dir_or_default
from attnserve.client import AsyncEncoderClient, keep_freed_heap
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from attnserve.service.process import spawn_server
from perf.full_maps import encode_ms
from perf.peer_env import KSERVE, Peer, peer_venv

PARTS = ("event loop", "other threads", "client")


def cpu(server_pid: int, client: Callable[[], float]) -> dict[str, float]:
    """CPU seconds so far of the server's main thread, its other threads, and the client."""
    threads = thread_seconds(server_pid)
    loop = threads.pop("main")
    return {"event loop": loop, "other threads": sum(threads.values()), "client": client()}


def main() -> None:
    given = [int(a) for a in sys.argv[1:4]]
    seq_len, calls, turns = given + [8, 1000, 4][len(given) :]
    keep_freed_heap()  # as the peers benchmark's clients keep theirs
    times: dict[str, list[float]] = {"attnserve": [], "KServe": []}
    used = {name: dict.fromkeys(PARTS, 0.0) for name in times}

    def turn(name: str, pid: int, client: Callable[[], float], run: Callable[[], list]) -> None:
        """One turn of `run`'s calls: their ms, and the CPU each part spent on them."""
        before = cpu(pid, client)
        times[name] += run()
        after = cpu(pid, client)
        for part in PARTS:
            used[name][part] += after[part] - before[part]

    with (
        model_dir_or_default(None, lambda _: None) as model_dir,
        contextlib.ExitStack() as stack,
        asyncio.Runner() as runner,
    ):
        runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))  # the peer's settings
        peer = Peer(KSERVE, peer_venv(KSERVE.venv, print), model_dir, runtime)
        stack.callback(peer.close)
        server = spawn_server(model_dir, "--provider", "cpu")
        stack.callback(server.process.wait, 30)
        stack.callback(server.process.terminate)
        client = AsyncEncoderClient(server.address)
        driver = peer.client.process.pid

        def attnserve() -> list:
            return runner.run(encode_ms(client, seq_len, calls))

        def kserve() -> list:
            return peer.ask("latency", seq_len=seq_len, n=calls)["ms"]

        def kserve_client() -> float:
            return sum(thread_seconds(driver).values())

        runner.run(encode_ms(client, seq_len, 100))  # warm-up, both
        peer.ask("latency", seq_len=seq_len, n=100)
        for _ in range(turns):
            turn("attnserve", server.process.pid, own_seconds, attnserve)
            turn("KServe", peer.server.pid, kserve_client, kserve)
        runner.run(client.close())
    total = calls * turns
    print(f"T = {seq_len}, {turns} turns of {calls} calls each; CPU ms a call:")
    print(f"{'':10s} {'p50 ms':>7s} " + " ".join(f"{p:>13s}" for p in PARTS))
    for name, parts in used.items():
        row = " ".join(f"{parts[p] / total * 1e3:13.2f}" for p in PARTS)
        print(f"{name:10s} {np.median(times[name]):7.3f} {row}")
    ratio = np.median(times["attnserve"]) / np.median(times["KServe"])
    print(f"p50 attnserve / KServe: {ratio:.3f}")


if __name__ == "__main__":
    main()
