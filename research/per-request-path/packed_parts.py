"""The parts of a float16 causal-packed map at 512 tokens that its floor (ORT's run plus an
echo of the bytes) does not contain: the server's cast and packing (AttentionReducer), the
answer's serialization, the client's parse and unpacking; each alone, in this process, on
the default model's shape (4 layers x 8 heads) with random weights. p50 of 30, in ms.

    PYTHONPATH=. .venv/bin/python research/per-request-path/packed_parts.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from attnserve.client.codec import parse_response
from attnserve.model.config import ModelConfig
from attnserve.model.packing import pack_causal, unpack_causal
from attnserve.service.core.backend import AttentionSelection
from attnserve.service.ort.reducer import AttentionReducer
from attnserve.service.ort.runtime import RuntimeOptions
from attnserve.service.ort.sessions import session_options
from attnserve.service.v1.response import EncodeAnswer
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import SplicedMessage

T = 512


def p50_ms(work: Callable[[], object], n: int = 30) -> float:
    work()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        work()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def main() -> None:
    config = ModelConfig()
    layers, heads = config.n_layers, config.n_heads
    weights = np.random.default_rng(0).random((layers, heads, T, T), dtype=np.float32)
    weights /= weights.sum(-1, keepdims=True)
    options = session_options(RuntimeOptions(provider="cpu"))
    reducer = AttentionReducer(["CPUExecutionProvider"], options, layers, heads)
    every = AttentionSelection(tuple(range(layers)), tuple(range(heads)))
    packed16 = AttentionSelection(every.layers, every.heads, float16=True, packed=True)
    half = weights.astype(np.float16)
    packed = reducer(weights, T, packed16).weights

    def answer() -> bytes:
        result = SplicedMessage(pb.EncodeResult(token_ids=list(range(T))))
        result.put("attention", packed, pb.DTYPE_FLOAT16)
        return EncodeAnswer(pb.EncodeResponse(), [result]).serialize()

    raw = answer()
    print(f"{layers} layers x {heads} heads, T = {T}: {len(raw) / 1e6:.1f} MB answer")
    print(f"server: cast and pack (reducer)  {p50_ms(lambda: reducer(weights, T, packed16)):.2f}")
    print(f"        of which packing alone   {p50_ms(lambda: pack_causal(half)):.2f}")
    print(f"        serialize the answer     {p50_ms(answer):.2f}")
    print(f"client: parse_response           {p50_ms(lambda: parse_response(raw)):.2f}")
    print(f"        of which unpacking alone {p50_ms(lambda: unpack_causal(packed, T)):.2f}")


if __name__ == "__main__":
    main()
