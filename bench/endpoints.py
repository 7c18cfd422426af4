"""One request at a time through each of the server's APIs, against the runtime alone.

The same answer (one vector per sequence, last-token pooling) through gRPC Encode,
OpenAI-compatible HTTP /v1/embeddings and V2 ModelInfer, from a server in its own process,
and from an identical ONNX Runtime session in this process; alternating blocks, so the
machine's noise hits every path alike. p50 and p99 per length.

    attnserve bench endpoints --out DIR [--model DIR]   # DIR/endpoints.{json,md}
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from attnserve.bench.results import save
from attnserve.bench.timing import repeated
from attnserve.client import ClientOptions, EncoderClient, OipClient
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from attnserve.service.process import spawn_server

LENGTHS = (8, 32, 128, 512)
PATHS = ("runtime alone", "gRPC Encode", "HTTP /v1/embeddings", "V2 ModelInfer")


def run_endpoints(
    out: Path, model_dir: Path, repeats: int = 40, log: Callable[[str], None] = print
) -> dict:
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    lengths = [t for t in LENGTHS if t <= runtime.config.max_seq_len]
    server = spawn_server(model_dir, "--provider", "cpu")
    options = ClientOptions(timeout_s=120)
    rows = []
    try:
        with (
            EncoderClient(server.address, options) as grpc_client,
            OipClient(server.address, options, shared_memory=False) as v2,
            httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=120) as http,
        ):
            name = grpc_client.model_info()["name"]
            for t in lengths:
                ids = np.random.default_rng(t).integers(0, 256, size=(1, t), dtype=np.int64)
                body = {"model": name, "input": [ids[0].tolist()]}
                calls = {
                    "runtime alone": lambda ids=ids: runtime.embed(ids),
                    "gRPC Encode": lambda ids=ids: grpc_client.encode(
                        [ids[0]], pooling="last", token_embeddings=False
                    ),
                    "HTTP /v1/embeddings": lambda body=body: _post(http, body),
                    "V2 ModelInfer": lambda ids=ids: v2.infer(input_ids=ids, outputs=["pooled"]),
                }
                samples = repeated(calls, repeats)
                row = {"seq_len": t}
                for path, times in samples.items():
                    row[path] = {
                        "p50_ms": round(float(np.percentile(times, 50)) * 1e3, 3),
                        "p99_ms": round(float(np.percentile(times, 99)) * 1e3, 3),
                    }
                rows.append(row)
                log(
                    f"  endpoints T={t}: " + ", ".join(f"{p} {row[p]['p50_ms']:.2f}" for p in PATHS)
                )
    finally:
        server.process.terminate()
        server.process.wait(30)
    result = {"repeats": repeats, "rows": rows}
    save(out, "endpoints", result, table(result))
    return result


def _post(http: httpx.Client, body: dict) -> dict:
    response = http.post("/v1/embeddings", json=body)
    response.raise_for_status()
    return response.json()


def table(result: dict) -> str:
    lines = [
        "| T | " + " | ".join(f"{p} p50 / p99" for p in PATHS) + " |",
        "|---|" + "---|" * len(PATHS),
    ]
    for row in result["rows"]:
        cells = [f"{row[p]['p50_ms']:.2f} / {row[p]['p99_ms']:.2f} ms" for p in PATHS]
        lines.append(f"| {row['seq_len']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
