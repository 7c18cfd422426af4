"""The floor of a short request, back to back and in turn: ONNX Runtime's run of the
embeddings graph and a bare gRPC echo of the answer's bytes, each timed alone in a tight
loop, then one after the other as a server meets them; beside a raw Encode call to
attnserve (request bytes in, answer bytes out, no client code) and the server's own
account of it (the answer's timings: total from admission to answer built, and ORT's run).
8 and 32 tokens, alternating blocks.

    PYTHONPATH=. .venv/bin/python research/per-request-path/floor_in_turn.py
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import numpy as np

from attnserve.bench.default_model import model_dir_or_default
from attnserve.client.client import ENCODE
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from attnserve.v1 import encoder_service_pb2 as pb
from perf.echo import Echo, echo_server
from perf.full_maps import serve_attnserve

LENGTHS, BLOCKS, CALLS = (8, 32), 6, 150


def request_of(seq_len: int) -> bytes:
    ids = pb.TokenIds(ids=np.random.default_rng(seq_len).integers(0, 256, size=seq_len).tolist())
    return pb.EncodeRequest(inputs=[pb.Input(token_ids=ids)]).SerializeToString()


def embed_ms(runtime: OrtRuntime, ids: np.ndarray) -> float:
    start = time.perf_counter()
    runtime.embed(ids)
    return (time.perf_counter() - start) * 1e3


async def measure(model_dir: Path, address: str, echo_address: str) -> None:
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    channel = grpc.aio.insecure_channel(address)
    raw = channel.unary_unary(ENCODE)
    echo = Echo(echo_address)
    for seq_len in LENGTHS:
        wire = request_of(seq_len)
        size = len(await raw(wire))
        ids = np.random.default_rng(seq_len).integers(0, 256, size=(1, seq_len))
        runtime.embed(ids)
        ms: dict[str, list[float]] = {}
        for _ in range(BLOCKS):
            for _ in range(CALLS):
                start = time.perf_counter()
                answer = pb.EncodeResponse.FromString(await raw(wire))
                ms.setdefault("raw Encode call", []).append((time.perf_counter() - start) * 1e3)
                ms.setdefault("  the server's total", []).append(answer.timings.total_ns / 1e6)
                ms.setdefault("  its ORT run", []).append(answer.timings.inference_ns / 1e6)
            ms.setdefault("ORT, back to back", []).extend(
                embed_ms(runtime, ids) for _ in range(CALLS)
            )
            ms.setdefault("echo, back to back", []).extend(
                [await echo.ms(size) for _ in range(CALLS)]
            )
            for _ in range(CALLS):
                ms.setdefault("ORT, in turn", []).append(embed_ms(runtime, ids))
                ms.setdefault("echo, in turn", []).append(await echo.ms(size))
        print(f"T = {seq_len} ({size} answer bytes), p50 of {BLOCKS * CALLS} calls:")
        for name, times in ms.items():
            print(f"  {name:<24} {np.median(times):.3f} ms")
    await channel.close()
    await echo.close()


def main() -> None:
    with (
        model_dir_or_default(None, lambda _: None) as model_dir,
        serve_attnserve(model_dir) as address,
        echo_server() as echo_address,
    ):
        asyncio.run(measure(model_dir, address, echo_address))


if __name__ == "__main__":
    main()
