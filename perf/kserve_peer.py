"""KServe's Python model server serving attnserve's graphs, and tritonclient driving it.

Runs only inside the peer's own virtual environment (peer_env.py creates it with
pinned kserve, tritonclient and the project's onnxruntime), so it imports nothing of
attnserve: the ORT session settings come from the parent as JSON, built by the very
function the server uses (ort/sessions.py session_settings).

    python kserve_peer.py serve --model-dir DIR --port PORT --session JSON
    python kserve_peer.py client --port PORT      # JSON commands on stdin, one per line

`serve` is a plain KServe `Model` whose synchronous `predict` runs the session on the
event loop: what a user gets from KServe with nothing but an ORT session (no batcher).
KServe binds every interface by default; here both its servers bind 127.0.0.1 only.
`client` answers each command line with one JSON line (see COMMANDS).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import numpy as np

MODEL_NAME = "attnserve"
LOOPBACK = "127.0.0.1"
MESSAGE_LIMIT = 256 * 1024 * 1024


def serve(model_dir: str, port: int, http_port: int, session: dict) -> None:
    # kserve parses the command line when imported; its gRPC messages stop at 8 MB otherwise
    # (all attention weights at 512 tokens are 34 MB).
    limit = str(MESSAGE_LIMIT)
    sys.argv = [sys.argv[0], "--grpc_max_send_message_length", limit]
    sys.argv += ["--grpc_max_receive_message_length", limit]
    import grpc.aio
    import onnxruntime as ort
    import uvicorn
    from kserve import InferOutput, InferResponse, Model, ModelServer

    _bind_loopback(grpc.aio, uvicorn)
    options = session_options(session)

    def open_graph(name: str) -> ort.InferenceSession:
        path = f"{model_dir}/{name}"
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    class Encoder(Model):
        def __init__(self) -> None:
            super().__init__(MODEL_NAME)
            # The graphs attnserve runs on CPU in float32: embeddings only, and the fused
            # full graph when attention is asked for.
            self.embeddings = open_graph("model_embeddings.onnx")
            self.full = open_graph(session["attention_graph"])
            self.ready = True

        def predict(self, payload, headers=None):
            ids = payload.get_input_by_name("input_ids").as_numpy()
            wanted = {o.name for o in payload.request_outputs or []}
            if "attentions" in wanted:
                embeddings, attentions = self.full.run(None, {"input_ids": ids})
                results = {"embeddings": embeddings, "attentions": attentions}
            else:
                results = {"embeddings": self.embeddings.run(None, {"input_ids": ids})[0]}
            outputs = []
            for name, array in results.items():
                output = InferOutput(name, list(array.shape), "FP32")
                output.set_data_from_numpy(array, binary_data=True)
                outputs.append(output)
            return InferResponse(payload.id, MODEL_NAME, outputs, from_grpc=payload.from_grpc)

    ModelServer(grpc_port=port, http_port=http_port, enable_docs_url=False).start([Encoder()])


def session_options(settings: dict):
    """ORT session options from attnserve's session_settings (service/ort/sessions.py) (as JSON)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = settings["intra_op_num_threads"]
    options.inter_op_num_threads = settings["inter_op_num_threads"]
    options.enable_mem_pattern = settings["enable_mem_pattern"]
    for key, value in settings["config_entries"].items():
        options.add_session_config_entry(key, value)
    return options


def _bind_loopback(grpc_aio, uvicorn) -> None:
    """KServe listens on [::] (gRPC) and 0.0.0.0 (REST): rebind both to 127.0.0.1."""
    make_server = grpc_aio.server

    def loopback_server(*args, **kwargs):
        server = make_server(*args, **kwargs)
        add_port = server.add_insecure_port
        server.add_insecure_port = lambda address: add_port(
            f"{LOOPBACK}:{address.rsplit(':', 1)[1]}"
        )
        return server

    grpc_aio.server = loopback_server

    class LoopbackConfig(uvicorn.Config):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **{**kwargs, "host": LOOPBACK})

    uvicorn.Config = LoopbackConfig


# ---------------------------------------------------------------- client side


class Client:
    """tritonclient's asyncio gRPC client, and the model it calls."""

    def __init__(self, triton, connection, model: str) -> None:
        self.triton, self.c, self.model = triton, connection, model

    async def infer(self, ids: np.ndarray, attention: bool = False) -> dict[str, np.ndarray]:
        """Embeddings (and the graph's full attentions: the KServe peer's output names)."""
        tensor = self.triton.InferInput("input_ids", list(ids.shape), "INT64")
        tensor.set_data_from_numpy(ids)
        names = ["embeddings", "attentions"] if attention else ["embeddings"]
        outputs = [self.triton.InferRequestedOutput(n) for n in names]
        result = await self.c.infer(self.model, [tensor], outputs=outputs)
        return {name: result.as_numpy(name) for name in names}  # as attnserve's client


async def client(port: int, model: str) -> None:
    import tritonclient.grpc.aio as triton

    target = f"{LOOPBACK}:{port}"
    channel_args = [
        ("grpc.max_send_message_length", MESSAGE_LIMIT),
        ("grpc.max_receive_message_length", MESSAGE_LIMIT),
    ]
    async with triton.InferenceServerClient(target, channel_args=channel_args) as c:
        peer = Client(triton, c, model)
        for line in sys.stdin:
            command = json.loads(line)
            answer = await COMMANDS[command.pop("op")](peer, **command)
            print(json.dumps(answer), flush=True)


async def _ready(peer: Client, timeout: float = 120.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if await peer.c.is_model_ready(peer.model):
                return {"ready": True}
        except Exception:  # not listening yet
            pass
        await asyncio.sleep(0.2)
    return {"ready": False}


async def _embed(peer: Client, ids: list[int]) -> dict:
    """KServe's embeddings of one sequence (tests check it serves the same graph)."""
    outputs = await peer.infer(np.array([ids], dtype=np.int64))
    return {"embeddings": outputs["embeddings"][0].tolist()}


async def _latency(peer: Client, seq_len: int, n: int, attention: bool = False) -> dict:
    """`n` sequential calls of one `seq_len`-token sequence: each call's ms."""
    ids = np.random.default_rng(seq_len).integers(0, 256, size=(1, seq_len))
    times = []
    for _ in range(n):
        start = time.perf_counter()
        await peer.infer(ids, attention)
        times.append((time.perf_counter() - start) * 1e3)
    return {"ms": times}


async def _v2_latency(
    peer: Client,
    seq_len: int,
    n: int,
    outputs: list[str],
    parameters: dict | None = None,
    shm_bytes: int = 0,
) -> dict:
    """`n` sequential ModelInfer calls asking for `outputs` with `parameters`, each decoded
    to numpy; with `shm_bytes`, the one output comes through a registered system
    shared-memory region of that size instead of the socket."""
    import tritonclient.utils.shared_memory as shm

    triton = peer.triton
    ids = np.random.default_rng(seq_len).integers(0, 256, size=(1, seq_len))
    tensor = triton.InferInput("input_ids", list(ids.shape), "INT64")
    tensor.set_data_from_numpy(ids)
    requested = [triton.InferRequestedOutput(name) for name in outputs]
    handle = None
    if shm_bytes:
        key = f"/attnserve-bench-{seq_len}-{shm_bytes}"
        handle = shm.create_shared_memory_region("bench", key, shm_bytes)
        await peer.c.register_system_shared_memory("bench", key, shm_bytes)
        (output,) = requested
        output.set_shared_memory("bench", shm_bytes)
    times = []
    try:
        for _ in range(n):
            start = time.perf_counter()
            result = await peer.c.infer(
                peer.model, [tensor], outputs=requested, parameters=parameters
            )
            for name in outputs:
                if handle is None:
                    result.as_numpy(name)
                else:
                    out = result.get_output(name)
                    dtype = triton_dtype(out.datatype)
                    shm.get_contents_as_numpy(handle, dtype, list(out.shape))
            times.append((time.perf_counter() - start) * 1e3)
    finally:
        if handle is not None:
            await peer.c.unregister_system_shared_memory("bench")
            shm.destroy_shared_memory_region(handle)
    return {"ms": times}


def triton_dtype(datatype: str):
    from tritonclient.utils import triton_to_np_dtype

    return triton_to_np_dtype(datatype)


def _draws(seed: int, lengths: list[int]):
    """The same kinds and ids as attnserve's LoadGenerator(mix of `lengths`, seed)."""
    kind_rng = np.random.default_rng([seed, 1])
    data_rng = np.random.default_rng([seed, 2])
    data = [data_rng.integers(0, 256, size=(1, n)) for n in lengths]
    uniform = np.full(len(lengths), 1 / len(lengths))
    return (lambda size=None: kind_rng.choice(len(data), size=size, p=uniform)), data


async def _closed(
    peer: Client, concurrency: int, duration: float, seed: int, lengths: list
) -> dict:
    draw, data = _draws(seed, lengths)
    tokens = requests = errors = 0
    start = time.perf_counter()

    async def worker() -> None:
        nonlocal tokens, requests, errors
        while time.perf_counter() - start < duration:
            ids = data[int(draw())]
            try:
                await peer.infer(ids)
            except Exception:
                errors += 1
                continue
            tokens, requests = tokens + ids.shape[1], requests + 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    return {"tokens": tokens, "requests": requests, "errors": errors, "elapsed": elapsed}


async def _open(peer: Client, rate: float, duration: float, seed: int, lengths: list) -> dict:
    """Poisson arrivals (as LoadGenerator.open_loop); latency from the intended send time."""
    draw, data = _draws(seed, lengths)
    gaps = np.random.default_rng([seed, 0]).exponential(1 / rate, int(rate * duration * 2) + 16)
    arrivals = np.cumsum(gaps)
    arrivals = arrivals[arrivals < duration]
    kinds = draw(len(arrivals))
    latencies, errors = [], 0
    start = time.perf_counter()

    async def one(intended: float, kind: int) -> None:
        nonlocal errors
        try:
            await peer.infer(data[kind])
        except Exception:
            errors += 1
            return
        latencies.append((time.perf_counter() - start - intended) * 1e3)

    tasks = []
    for intended, kind in zip(arrivals, kinds, strict=True):
        delay = start + intended - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(float(intended), int(kind))))
    await asyncio.gather(*tasks)
    return {"ms": latencies, "errors": errors, "elapsed": time.perf_counter() - start}


COMMANDS = {
    "ready": _ready,
    "embed": _embed,
    "latency": _latency,
    "v2_latency": _v2_latency,
    "closed": _closed,
    "open": _open,
}


def serve_command(description: str):
    """The parser of the `serve` command every peer's script takes (peer_env.Peer runs it),
    and its subcommands, to add others to."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--model-dir", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--http-port", type=int, required=True)
    s.add_argument("--session", required=True, help="ORT session settings as JSON")
    return parser, sub


def main() -> None:
    parser, sub = serve_command(__doc__.splitlines()[0])
    c = sub.add_parser("client")
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--model", default=MODEL_NAME, help="the model to call")
    args = parser.parse_args()
    if args.mode == "serve":
        serve(args.model_dir, args.port, args.http_port, json.loads(args.session))
    else:
        asyncio.run(client(args.port, args.model))


if __name__ == "__main__":
    main()
