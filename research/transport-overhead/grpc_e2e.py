"""End-to-end gRPC cost over the bare runtime (attention on the wire: bench/attention.py).

The server runs as its own process (as deployed); the runtime-alone numbers
come from an identical ORT session in this process, the transport's floor
from a bare echo server moving the same bytes, and the least a Python server
that runs the model can do from echo servers that only run it, three ways
(echo.py), all timed in alternating blocks so machine noise hits them
alike. It also runs pause.py (the model's run after a pause, beside ORT's
run inside the server), a stream against sequential calls, and HTTP against gRPC.
"""

from __future__ import annotations

import functools
from pathlib import Path

import httpx
import numpy as np
from echo import EchoServer, request_for
from pause import after_pause
from pause import markdown as pause_markdown

from attnserve.bench.default_model import model_dir_or_default
from attnserve.bench.results import progress, save
from attnserve.bench.timing import alternate, p50_ms, repeated
from attnserve.client import ClientOptions, EncoderClient
from attnserve.client.codec import build_request, decode_response
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
from attnserve.service.process import spawn_server

# Python servers that only run the model (echo.py): each row field's prefix, and where
# that server runs the model.
SHAPES = {
    "minimal": "on a worker thread",  # grpc.aio, as this server does
    "inline": "on the event loop",  # grpc.aio, no hand-off
    "sync": "in a thread-pool server's handler thread",  # grpc's sync server
}


def measure(model_dir: Path, max_seq_len: int, quick: bool, log=print) -> dict:
    runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
    limit = min(max_seq_len, runtime.config.max_seq_len)
    seq_lens = [t for t in (8, 16, 32, 64, 128, 256, 512) if t <= limit]
    server = spawn_server(model_dir, "--provider", "cpu")
    echo = EchoServer(model_dir)
    sync_echo = EchoServer(model_dir, sync=True)
    floors = {  # the echo servers' calls, each stamped with its legs
        "bare": (echo, "Echo"),
        "minimal": (echo, "Model"),
        "inline": (echo, "ModelInline"),
        "sync": (sync_echo, "Model"),
    }
    rng = np.random.default_rng(0)
    try:
        client = EncoderClient(server.address, ClientOptions(timeout_s=120))
        client.wait_until_serving(120)
        # The floor under any RPC here: a health check does no work at all.
        floor = repeated({"health": client.health}, repeats=10 if quick else 100)
        empty_rpc_ms = round(p50_ms(floor["health"]), 4)
        log(f"  empty RPC (health check) p50: {empty_rpc_ms:.2f} ms")
        overhead = []
        for t in seq_lens:
            ids = rng.integers(0, runtime.config.vocab_size, size=(1, t), dtype=np.int64)
            # The server's own timings of each call; the echo server's legs of each call.
            served: dict[str, list] = {name: [] for name in ("grpc", *floors)}

            # The echo servers move exactly the bytes of this Encode call, both ways.
            same_bytes = request_for(
                build_request([ids[0]]).SerializeToString(),
                client.encode([ids[0]]).response.ByteSize(),
            )
            times = repeated(
                {
                    "runtime": lambda ids=ids: runtime.embed(ids),
                    "grpc": lambda ids=ids: client.encode([ids[0]]),
                    **{
                        name: functools.partial(floor_server.call, method, same_bytes)
                        for name, (floor_server, method) in floors.items()
                    },
                },
                repeats=5 if quick else (50 if t <= 128 else 20),
                answers=served,
            )
            row = {
                "seq_len": t,
                "runtime_p50_ms": round(p50_ms(times["runtime"]), 4),
                "grpc_p50_ms": round(p50_ms(times["grpc"]), 4),
                "bare_grpc_p50_ms": round(p50_ms(times["bare"]), 4),
                **{f"{name}_server_p50_ms": round(p50_ms(times[name]), 4) for name in SHAPES},
                "server_total_p50_ms": round(p50_ms([a.total_ns / 1e9 for a in served["grpc"]]), 4),
                # The same ORT run inside the server, which waits a round trip between calls.
                "server_inference_p50_ms": round(
                    p50_ms([a.inference_ns / 1e9 for a in served["grpc"]]), 4
                ),
            }
            for name in ("bare", "minimal"):  # the transport's legs, with and without the model
                for leg in ("to_handler", "back"):
                    seconds = [getattr(call, leg) for call in served[name]]
                    row[f"{name}_{leg}_p50_ms"] = round(p50_ms(seconds), 4)
            row["overhead_p50_ms"] = round(row["grpc_p50_ms"] - row["runtime_p50_ms"], 4)
            row["overhead_to_bare"] = round(row["overhead_p50_ms"] / row["bare_grpc_p50_ms"], 2)
            # What a Python server that only runs the model adds, on the same scale.
            for name in SHAPES:
                row[f"{name}_overhead_to_bare"] = round(
                    (row[f"{name}_server_p50_ms"] - row["runtime_p50_ms"])
                    / row["bare_grpc_p50_ms"],
                    2,
                )
            row["best_python_overhead_to_bare"] = min(
                row[f"{name}_overhead_to_bare"] for name in SHAPES
            )
            # The transport alone, once the model runs in between, on the same scale.
            row["minimal_legs_to_bare"] = round(
                (row["minimal_to_handler_p50_ms"] + row["minimal_back_p50_ms"])
                / row["bare_grpc_p50_ms"],
                2,
            )
            overhead.append(row)
            log(
                f"  embeddings, seq_len {t:>4}: runtime {row['runtime_p50_ms']:.2f} ms, "
                f"gRPC {row['grpc_p50_ms']:.2f} ms, overhead {row['overhead_p50_ms']:+.2f} ms "
                f"= {row['overhead_to_bare']:.2f}x the bare round trip "
                f"({row['bare_grpc_p50_ms']:.2f} ms); servers that only run the model: "
                + ", ".join(
                    f"{name} {row[f'{name}_server_p50_ms']:.2f} ms "
                    f"({row[f'{name}_overhead_to_bare']:.2f}x)"
                    for name in SHAPES
                )
            )

        pauses = after_pause(model_dir, runtime, quick, log)
        stream = _stream_vs_unary(client, runtime.config.vocab_size, quick, log)

        http_rows = _http_vs_grpc(
            server, client, runtime, [t for t in (8, 128) if t <= limit], quick, log
        )

        client.close()
    finally:
        echo.close()
        sync_echo.close()
        server.process.terminate()
        server.process.wait(30)
    return {
        "empty_rpc_p50_ms": empty_rpc_ms,
        "embeddings_overhead": overhead,
        "runtime_after_pause": pauses,
        "stream_vs_unary": stream,
        "http_vs_grpc": http_rows,
    }


def _stream_vs_unary(client, vocab_size: int, quick: bool, log) -> dict:
    """200 short requests (12 tokens) on one EncodeStream vs one Encode call after another."""
    rng = np.random.default_rng(2)
    inputs = [rng.integers(0, vocab_size, 12) for _ in range(200)]
    requests = [build_request([x], request_id=str(i)) for i, x in enumerate(inputs)]

    def stream() -> None:  # decoded like EncoderClient.encode decodes, so both pay for it
        answers = [decode_response(a.response) for a in client.encode_stream(requests)]
        assert [a.request_id for a in answers] == [r.request_id for r in requests]

    def unary() -> None:
        for x in inputs:
            client.encode([x])

    times = alternate({"stream": stream, "unary": unary}, least=3 if quick else 9, most=9)[0]
    row = {
        "requests": len(requests),
        "tokens_each": 12,
        "stream_ms": round(p50_ms(times["stream"]), 1),
        "unary_ms": round(p50_ms(times["unary"]), 1),
    }
    row["speedup"] = round(row["unary_ms"] / row["stream_ms"], 2)
    log(
        f"  200 x 12 tokens: one EncodeStream {row['stream_ms']:.0f} ms, sequential Encode "
        f"{row['unary_ms']:.0f} ms ({row['speedup']:.2f}x)"
    )
    return row


def _http_vs_grpc(server, client, runtime, seq_lens, quick, log) -> list[dict]:
    """The same answer (one vector, last-token pooling) through gRPC Encode and through the
    OpenAI-compatible /v1/embeddings (JSON numbers, and base64 as OpenAI's SDK asks)."""
    rows = []
    rng = np.random.default_rng(1)
    with httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=120) as http:
        for t in seq_lens:
            ids = rng.integers(0, 256, size=(1, t), dtype=np.int64)
            body = {"model": "any", "input": [ids[0].tolist()]}
            calls = {
                "runtime": lambda ids=ids: runtime.embed(ids),
                "grpc": lambda ids=ids: client.encode(
                    [ids[0]], pooling="last", token_embeddings=False
                ),
                "http": lambda body=body: http.post("/v1/embeddings", json=body).json(),
                "http-base64": lambda body=body: http.post(
                    "/v1/embeddings", json={**body, "encoding_format": "base64"}
                ).json(),
            }
            times = repeated(calls, repeats=5 if quick else 50)
            row = {"seq_len": t, **{f"{k}_p50_ms": round(p50_ms(v), 4) for k, v in times.items()}}
            rows.append(row)
            log(
                f"  pooled, seq_len {t:>4}: gRPC {row['grpc_p50_ms']:.2f} ms, HTTP "
                f"{row['http_p50_ms']:.2f} ms (base64 {row['http-base64_p50_ms']:.2f} ms)"
            )
    return rows


def markdown(result: dict) -> str:
    lines = [
        f"Empty RPC (standard health check) p50: {result['empty_rpc_p50_ms']:.2f} ms",
        "",
        "| seq len | runtime alone p50 | gRPC Encode p50 | overhead | server-side total p50 "
        "| ORT inside the server p50 | bare gRPC, same bytes | overhead / bare |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["embeddings_overhead"]:
        lines.append(
            f"| {r['seq_len']} | {r['runtime_p50_ms']:.2f} ms | {r['grpc_p50_ms']:.2f} ms "
            f"| {r['overhead_p50_ms']:+.2f} ms | {r['server_total_p50_ms']:.2f} ms "
            f"| {r['server_inference_p50_ms']:.2f} ms | {r['bare_grpc_p50_ms']:.2f} ms "
            f"| {r['overhead_to_bare']:.2f}x |"
        )
    lines += [
        "",
        "Overhead / bare: (Encode - runtime alone) / bare. The same ratio for Python servers "
        "that only run the model (echo.py): they read the request's token ids, run the "
        "same embeddings graph and answer its bytes, nothing else. Each runs it its own way: "
        "on a worker thread (grpc.aio, as this server does), on the event loop itself "
        "(grpc.aio; it stalls every other call meanwhile, so no real server can), or in the "
        "thread gRPC's thread-pool server runs the handler on.",
        "",
        "| seq len | "
        + " | ".join(f"{way}: p50 | / bare" for way in SHAPES.values())
        + " | best / bare |",
        "|---|" + "---|---|" * len(SHAPES) + "---|",
    ]
    for r in result["embeddings_overhead"]:
        shapes = " | ".join(
            f"{r[f'{name}_server_p50_ms']:.2f} ms | {r[f'{name}_overhead_to_bare']:.2f}x"
            for name in SHAPES
        )
        lines.append(f"| {r['seq_len']} | {shapes} | {r['best_python_overhead_to_bare']:.2f}x |")
    lines += [
        "",
        "The worker-thread server's legs (its handler stamps its start and end on the "
        "machine's monotonic clock): from the client's call to the handler, and from the "
        "handler back, without the model (bare) and with it (minimal).",
        "",
        "| seq len | bare: to the handler | bare: back | minimal: to the handler "
        "| minimal: back | minimal's legs / bare round trip |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["embeddings_overhead"]:
        lines.append(
            f"| {r['seq_len']} | {r['bare_to_handler_p50_ms']:.2f} ms "
            f"| {r['bare_back_p50_ms']:.2f} ms | {r['minimal_to_handler_p50_ms']:.2f} ms "
            f"| {r['minimal_back_p50_ms']:.2f} ms | {r['minimal_legs_to_bare']:.2f}x |"
        )
    pauses = result.get("runtime_after_pause", [])
    if pauses:
        lines += ["", pause_markdown(pauses)]
    s = result["stream_vs_unary"]
    lines += [
        "",
        f"{s['requests']} requests of {s['tokens_each']} tokens: one EncodeStream "
        f"{s['stream_ms']:.0f} ms, one Encode after another {s['unary_ms']:.0f} ms "
        f"({s['speedup']:.2f}x).",
    ]
    lines += [
        "",
        "| one pooled vector (last token) | runtime alone p50 | gRPC Encode p50 "
        "| HTTP /v1/embeddings p50 | same, base64 | HTTP / gRPC |",
        "|---|---|---|---|---|---|",
    ]
    for r in result.get("http_vs_grpc", []):
        lines.append(
            f"| {r['seq_len']} tokens | {r['runtime_p50_ms']:.2f} ms | {r['grpc_p50_ms']:.2f} ms "
            f"| {r['http_p50_ms']:.2f} ms | {r['http-base64_p50_ms']:.2f} ms "
            f"| {r['http_p50_ms'] / r['grpc_p50_ms']:.2f}x |"
        )
    return "\n".join(lines)


def run_grpc(out: Path, model_dir: Path | None, max_seq_len: int, quick: bool) -> dict:
    with model_dir_or_default(model_dir, progress) as model_dir:
        result = measure(model_dir, max_seq_len, quick, progress)
    save(out, "grpc", result, markdown(result))
    plot_breakdown(result, out / BREAKDOWN_PLOT)
    return result


BREAKDOWN_PLOT = "grpc_breakdown.png"


def plot_breakdown(result: dict, path: Path) -> Path:
    """Where a request's time goes, per length: medians of one run, stacked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["embeddings_overhead"] if r["seq_len"] <= 128]
    model_in_server = [max(r["runtime_p50_ms"], r["server_inference_p50_ms"]) for r in rows]
    parts = {
        "the model, run back to back (runtime alone)": [r["runtime_p50_ms"] for r in rows],
        "the same ORT run slower inside the server (a pause before each call)": [
            m - r["runtime_p50_ms"] for r, m in zip(rows, model_in_server, strict=True)
        ],
        "the server's own work: queue, thread hand-offs, request and answer": [
            max(0.0, r["server_total_p50_ms"] - m)
            for r, m in zip(rows, model_in_server, strict=True)
        ],
        "bare gRPC round trip of the same bytes": [r["bare_grpc_p50_ms"] for r in rows],
        "the rest: the transport slower after a model run, gRPC call handling, client decoding": [
            max(0.0, r["grpc_p50_ms"] - r["server_total_p50_ms"] - r["bare_grpc_p50_ms"])
            for r in rows
        ],
    }
    labels = [str(r["seq_len"]) for r in rows]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    bottom = [0.0] * len(rows)
    for name, values in parts.items():
        ax.bar(labels, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.plot(labels, [r["grpc_p50_ms"] for r in rows], "k_", markersize=30, label="Encode p50")
    ax.plot(
        labels,
        [min(r[f"{name}_server_p50_ms"] for name in SHAPES) for r in rows],
        "rx",
        markersize=10,
        label="the fastest Python server that only runs the model, p50",
    )
    ax.plot(
        labels,
        [r["runtime_p50_ms"] + 1.5 * r["bare_grpc_p50_ms"] for r in rows],
        "_",
        color="gold",
        markersize=36,
        markeredgewidth=3,
        label="issue 12's target: runtime alone + 1.5 x bare round trip",
    )
    ax.set_xlabel("tokens (batch 1, embeddings only)")
    ax.set_ylabel("ms (medians, stacked)")
    ax.set_title("Where one Encode's time goes")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the bars
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
