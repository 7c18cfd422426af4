"""The Open Inference Protocol (KServe V2) beside attnserve.v1, on one server.

1. ModelInfer (tritonclient, from .venv-peers) against Encode (attnserve's client): one
   request at a time, embeddings only, T = 8, 32, 128, 512, alternating blocks.
2. All attention weights at the longest length, float32 full and float16 causal-packed:
   ONNX Runtime alone in this process, Encode over the wire, ModelInfer over the wire, and
   ModelInfer through a system shared-memory region (the client on the same host), and
   attnserve's own OipClient, which registers a region by itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from attnserve.bench.results import save
from attnserve.client import AsyncEncoderClient, ClientOptions, OipClient
from attnserve.model.packing import packed_length
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from attnserve.service.process import spawn_server
from perf.full_maps import encode_ms, runtime_ms
from perf.peer_env import TritonDriver, peer_venv
from perf.peers import LATENCY_LENGTHS


def _infer_ms(client: OipClient, seq_len: int, n: int) -> list:
    ids = np.random.default_rng(seq_len).integers(0, 256, size=(1, seq_len)).tolist()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        client.infer(input_ids=ids, outputs=["attention"])
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _p50(times: list[float]) -> float:
    return round(float(np.median(times)), 3)


def run_oip(out: Path, model_dir: Path, venv: Path, blocks: int = 5, log: Callable = print) -> dict:
    python = peer_venv(venv, log)
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    c = runtime.config
    longest = min(max(LATENCY_LENGTHS), c.max_seq_len)
    lengths = sorted({min(t, longest) for t in LATENCY_LENGTHS})
    server = spawn_server(model_dir, "--provider", "cpu")
    driver = TritonDriver(python, int(server.address.rsplit(":", 1)[1]), c.name)
    f32_bytes = c.n_layers * c.n_heads * longest * longest * 4
    f16_packed_bytes = c.n_layers * c.n_heads * packed_length(longest) * 2
    f16_packed = {"attention_dtype": "FP16", "attention_layout": "causal_packed"}
    rows = {t: {"Encode": [], "ModelInfer": []} for t in lengths}
    attention = {
        name: []
        for name in (
            "runtime alone",
            "Encode, f32 full",
            "ModelInfer, f32 full",
            "ModelInfer + shared memory, f32 full",
            "attnserve OipClient (shared memory by itself), f32 full",
            "Encode, f16 packed",
            "ModelInfer + shared memory, f16 packed",
        )
    }
    try:
        if not driver.ready():
            raise RuntimeError("attnserve's V2 service did not answer ModelReady")
        with asyncio.Runner() as runner:
            client = AsyncEncoderClient(server.address, ClientOptions(timeout_s=120))
            v2 = OipClient(server.address, ClientOptions(timeout_s=120))
            for block in range(blocks):
                for t in lengths:
                    n = 30 if t < longest else 8
                    order = ("Encode", "ModelInfer") if block % 2 == 0 else ("ModelInfer", "Encode")
                    for name in order:
                        if name == "Encode":
                            ms = runner.run(encode_ms(client, t, n))
                        else:
                            ask = {"seq_len": t, "n": n, "outputs": ["embeddings"]}
                            ms = driver.ask("v2_latency", **ask)["ms"]
                        rows[t][name] += ms
                n, t = 3, longest
                attention["runtime alone"] += runtime_ms(runtime, t, n)
                attention["Encode, f32 full"] += runner.run(encode_ms(client, t, n, attention=True))
                attention["ModelInfer, f32 full"] += driver.ask(
                    "v2_latency", seq_len=t, n=n, outputs=["attention"]
                )["ms"]
                attention["ModelInfer + shared memory, f32 full"] += driver.ask(
                    "v2_latency", seq_len=t, n=n, outputs=["attention"], shm_bytes=f32_bytes
                )["ms"]
                attention["attnserve OipClient (shared memory by itself), f32 full"] += _infer_ms(
                    v2, t, n
                )
                attention["Encode, f16 packed"] += runner.run(
                    encode_ms(
                        client,
                        t,
                        n,
                        attention=True,
                        attention_dtype="float16",
                        attention_layout="causal-packed",
                    )
                )
                attention["ModelInfer + shared memory, f16 packed"] += driver.ask(
                    "v2_latency",
                    seq_len=t,
                    n=n,
                    outputs=["attention"],
                    parameters=f16_packed,
                    shm_bytes=f16_packed_bytes,
                )["ms"]
                log(f"  oip block {block + 1}/{blocks}")
            runner.run(client.close())
            v2.close()
    finally:
        driver.close()
        server.process.terminate()
        server.process.wait(30)
    runtime_p50 = _p50(attention["runtime alone"])
    result = {
        "latency": [
            {
                "seq_len": t,
                "encode_p50_ms": _p50(r["Encode"]),
                "model_infer_p50_ms": _p50(r["ModelInfer"]),
                "ratio": round(_p50(r["ModelInfer"]) / _p50(r["Encode"]), 3),
            }
            for t, r in rows.items()
        ],
        "attention": {
            "seq_len": longest,
            "f32_bytes": f32_bytes,
            "f16_packed_bytes": f16_packed_bytes,
            "rows": [
                {"path": name, "p50_ms": _p50(ms), "vs_runtime": round(_p50(ms) / runtime_p50, 3)}
                for name, ms in attention.items()
            ],
        },
    }
    save(out, "oip", result, table(result))
    return result


def table(result: dict) -> str:
    lines = [
        "| T | Encode p50 | ModelInfer p50 | ModelInfer / Encode |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['seq_len']} | {r['encode_p50_ms']:.2f} ms | {r['model_infer_p50_ms']:.2f} ms | "
        f"{r['ratio']:.2f}x |"
        for r in result["latency"]
    ]
    a = result["attention"]
    lines += [
        "",
        f"All attention weights at T={a['seq_len']} ({a['f32_bytes'] / 1e6:.1f} MB in float32, "
        f"{a['f16_packed_bytes'] / 1e6:.1f} MB float16 causal-packed), decoded to numpy:",
        "",
        "| path | p50 | / runtime alone |",
        "|---|---|---|",
    ]
    lines += [f"| {r['path']} | {r['p50_ms']:.1f} ms | {r['vs_runtime']:.2f}x |" for r in a["rows"]]
    return "\n".join(lines)
