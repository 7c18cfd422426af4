"""Every attention weight against its floor: what the peers benchmark asks of attnserve's
full maps, and SmolLM2-135M's 1024-token map.

The floor of a map is ONNX Runtime's own run of the full graph in the benchmark's process
plus a bare gRPC echo of the answer's bytes (echo.py): what computing the map and moving it
cost without a server around them.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from attnserve.client import AsyncEncoderClient, ClientOptions
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from attnserve.service.process import spawn_server
from attnserve.service.settings import Settings
from perf.echo import Echo, echo_server

ATTNSERVE = "attnserve"
F32, F16_PACKED = "all, float32", "all, float16 causal-packed"
F16_KEPT = "all, float16 causal-packed, kept packed"  # by the client: as the echo's bytes
_F16 = {"attention": True, "attention_dtype": "float16", "attention_layout": "causal-packed"}
MAP_OPTIONS = {
    F32: {"attention": True},
    F16_PACKED: _F16,
    F16_KEPT: {**_F16, "unpack_attention": False},
}
PACKED_MAPS = (F16_PACKED, F16_KEPT)  # attnserve's own: the peers have no such answer
# How the big map is asked for: (name, the call, its options, how its target row says it)
BIG_MAP_WAYS = (
    (ATTNSERVE, "encode", F16_PACKED, ""),
    ("kept packed", "encode", F16_KEPT, ", kept packed"),
    ("a layer per message", "encode_layers", F16_PACKED, ", a layer per message"),
)
BIG_MAP_LENGTH = 1024  # SmolLM2-135M's full map at this length
BIG_MAP_TARGET = 2.0  # attnserve / (runtime + echo), at most


@contextlib.contextmanager
def serve_attnserve(model_dir: Path, *flags: str) -> Iterator[str]:
    """attnserve on the CPU in its own process while the block runs: its address."""
    server = spawn_server(model_dir, "--provider", "cpu", "--max-queue", "1024", *flags)
    try:
        yield server.address
    finally:
        server.process.terminate()
        server.process.wait(30)


async def encode_ms(
    client: AsyncEncoderClient, seq_len: int, n: int, call: str = "encode", **options
) -> list[float]:
    """`n` sequential calls (`call`: encode or encode_layers) of one seeded `seq_len`-token
    sequence: each call's ms."""
    ids = np.random.default_rng(seq_len).integers(0, 256, size=seq_len).tolist()
    method = getattr(client, call)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        await method([ids], **options)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def runtime_ms(runtime: OrtRuntime, seq_len: int, n: int) -> list[float]:
    """`n` runs of the full graph (every attention weight, float32) after a warm-up one."""
    ids = np.random.default_rng(seq_len).integers(0, 256, size=(1, seq_len))
    runtime.run(ids)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        runtime.run(ids)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def measure_big_map(work: Path, repeats: int, log: Callable[[str], None]) -> dict:
    """SmolLM2-135M's shape (random weights) at BIG_MAP_LENGTH tokens: every attention weight,
    float16 causal-packed, through the server, against ORT's run of the full graph in this
    process plus the echo of the answer's bytes; and once more after the server, idle, gave
    its memory back (every page of the answer's buffers faulted in afresh)."""
    from perf.hf_checkpoints import SMOLLM2_135M, build_checkpoint

    log(f"peers: SmolLM2-135M's shape at {BIG_MAP_LENGTH} tokens: building and importing it")
    build_checkpoint("llama", work / "hf", perturb=0.0, **SMOLLM2_135M)
    model_dir = work / "model"
    command = [sys.executable, "-m", "attnserve", "export", "--from-hf", str(work / "hf")]
    command += ["--out", str(model_dir), "--max-seq-len", str(BIG_MAP_LENGTH)]
    subprocess.run(command, check=True, capture_output=True)
    limits = ("--max-message-bytes", str(2**31 - 1), "--max-inflight-bytes", str(8 * 2**30))
    times: dict[str, list[float]] = {name: [] for name, *_ in BIG_MAP_WAYS}
    times |= {"runtime": [], "echo": []}
    with (
        asyncio.Runner() as runner,
        echo_server() as echo_address,
        serve_attnserve(model_dir, *limits) as address,
    ):
        client = AsyncEncoderClient(
            address, ClientOptions(timeout_s=600, max_message_bytes=2**31 - 1)
        )
        ids = list(range(3, 3 + BIG_MAP_LENGTH))
        size = runner.run(client.encode([ids], **MAP_OPTIONS[F16_PACKED])).wire_bytes
        echo = Echo(echo_address)
        runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
        for _ in range(repeats):  # alternating, one of each at a time
            for name, call, attention, _ in BIG_MAP_WAYS:
                times[name] += runner.run(
                    encode_ms(client, BIG_MAP_LENGTH, 1, call, **MAP_OPTIONS[attention])
                )
            times["runtime"] += runtime_ms(runtime, BIG_MAP_LENGTH, 1)
            times["echo"].append(runner.run(echo.ms(size)))
        del runtime
        time.sleep(Settings.release_after_idle_s + 5.0)  # the idle release, and its run
        after_release = runner.run(encode_ms(client, BIG_MAP_LENGTH, 1, **MAP_OPTIONS[F16_PACKED]))
        runner.run(client.close())
        runner.run(echo.close())
    p50 = {name: round(float(np.median(ms)), 1) for name, ms in times.items()}
    floor = p50["runtime"] + p50["echo"]
    return {
        "seq_len": BIG_MAP_LENGTH,
        "bytes": size,
        "repeats": repeats,
        "p50_ms": p50,
        "vs_floor": {name: round(p50[name] / floor, 3) for name, *_ in BIG_MAP_WAYS},
        "after_release_ms": round(after_release[0], 1),
        "megabytes_per_s": round(size / 1e6 / (p50[ATTNSERVE] / 1e3), 1),
    }


def big_map_summary(b: dict) -> str:
    """measure_big_map's result as a sentence."""
    return (
        f"SmolLM2-135M's shape, every attention weight at {b['seq_len']} tokens, float16 "
        f"causal-packed ({b['bytes'] / 1e6:.0f} MB): attnserve {b['p50_ms'][ATTNSERVE]:,.0f} "
        f"ms ({b['megabytes_per_s']:.0f} MB/s), ORT's run {b['p50_ms']['runtime']:,.0f} ms + "
        f"the echo {b['p50_ms']['echo']:,.0f} ms: {b['vs_floor'][ATTNSERVE]:.2f}x (p50 of "
        f"{b['repeats']}); "
        + "; ".join(
            f"{name} {b['p50_ms'][name]:,.0f} ms: {b['vs_floor'][name]:.2f}x"
            for name, *_ in BIG_MAP_WAYS[1:]
        )
        + ". The first call after the idle server gave its memory back: "
        f"{b['after_release_ms']:,.0f} ms."
    )


def big_map_targets(b: dict) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for measure_big_map's result, one row per way of asking."""
    target = f"SmolLM2-135M's full {b['seq_len']}-token map: <= {BIG_MAP_TARGET:g}x the runtime"
    rows = []
    for name, _, _, how in BIG_MAP_WAYS:
        ratio = b["vs_floor"][name]
        rows.append((f"{target} + echo{how}", f"{ratio:.2f}x", ratio <= BIG_MAP_TARGET))
    return rows
