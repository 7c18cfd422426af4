"""attnserve's own share of a short request, on each side of the wire: the Encode handler
in process against ONNX Runtime's run of the same graph alone (plan, budget, batcher,
metrics, the answer), and the client against a raw gRPC call of the same request bytes to
the same server (building the request, decoding the answer); 8 and 32 tokens, alternating.

    PYTHONPATH=. .venv/bin/python research/per-request-path/own_share.py
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import numpy as np

from attnserve.bench.default_model import model_dir_or_default
from attnserve.client import AsyncEncoderClient
from attnserve.client.client import ENCODE
from attnserve.service.grpc.encoder import EncoderServicer
from attnserve.service.server import start_server
from attnserve.service.settings import Settings
from attnserve.v1 import encoder_service_pb2 as pb
from perf.full_maps import serve_attnserve

LENGTHS, BLOCKS, CALLS = (8, 32), 5, 200


class _Context:
    """What the handler asks of gRPC's context."""

    def time_remaining(self) -> float:
        return 30.0


def request_of(seq_len: int) -> pb.EncodeRequest:
    ids = pb.TokenIds(ids=[i % 256 for i in range(seq_len)])
    return pb.EncodeRequest(inputs=[pb.Input(token_ids=ids)])


async def handler_share(model_dir: Path) -> None:
    settings = Settings(
        model=model_dir, host="127.0.0.1", port=0, metrics_port=-1, http_port=-1, provider="cpu"
    )
    running = await start_server(settings)
    servicer, backend = EncoderServicer(running.repository), running.backend
    for seq_len in LENGTHS:
        wire = request_of(seq_len).SerializeToString()
        ids = np.array([[i % 256 for i in range(seq_len)]], dtype=np.int64)
        alone, handled = [], []
        for _ in range(BLOCKS):
            for _ in range(CALLS):
                start = time.perf_counter()
                backend.embed(ids)
                alone.append(time.perf_counter() - start)
                start = time.perf_counter()
                answer = await servicer.Encode(pb.EncodeRequest.FromString(wire), _Context())
                answer.serialize()
                handled.append(time.perf_counter() - start)
        a, h = np.median(alone) * 1e3, np.median(handled) * 1e3
        print(f"T = {seq_len}: ORT alone {a:.3f} ms, the handler {h:.3f} ms (+{h - a:.3f})")
    await running.stop(1.0)


async def client_share(address: str) -> None:
    client = AsyncEncoderClient(address)
    channel = grpc.aio.insecure_channel(address)
    raw = channel.unary_unary(ENCODE)
    for seq_len in LENGTHS:
        ids = [i % 256 for i in range(seq_len)]
        wire = request_of(seq_len).SerializeToString()
        ours, bare = [], []
        for _ in range(BLOCKS):
            for _ in range(CALLS):
                start = time.perf_counter()
                await client.encode([ids])
                ours.append(time.perf_counter() - start)
            for _ in range(CALLS):
                start = time.perf_counter()
                await raw(wire, timeout=30)
                bare.append(time.perf_counter() - start)
        o, b = np.median(ours) * 1e3, np.median(bare) * 1e3
        print(f"T = {seq_len}: the client {o:.3f} ms, a raw call {b:.3f} ms (+{o - b:.3f})")
    await client.close()
    await channel.close()


def main() -> None:
    with model_dir_or_default(None, lambda _: None) as model_dir:
        asyncio.run(handler_share(model_dir))
        with serve_attnserve(model_dir) as address:
            asyncio.run(client_share(address))


if __name__ == "__main__":
    main()
