"""The Python gRPC floors: bare gRPC servers that answer with N bytes.

`Echo` parses nothing and computes nothing, so a round trip to it costs what
the transport alone costs for the bytes an Encode call moves. Served with
--model, the `Model` methods are the least a Python server that runs the model
can do: read the token ids of an EncodeRequest, run the embeddings graph,
answer with the embeddings' bytes; no validation, queue, batching, metrics or
protobuf answer. They run the model three ways:

- `Model` (grpc.aio): on a worker thread, as this server does, to keep the
  event loop free;
- `ModelInline` (grpc.aio): on the event loop itself, no hand-off (it stalls
  every other call meanwhile, so no real server can do it);
- `Model` of the server started with --sync (grpc's thread-pool server): in
  the thread gRPC runs the handler on.

`run.py grpc` runs them as their own processes, like the real server, and compares:

    python research/transport-overhead/echo.py --ready-file F [--model DIR] [--sync]

The request's first 4 bytes (little-endian) say how many bytes to answer, so
one server answers every sequence length; the rest is the payload. An answer's
first 16 bytes are the handler's start and end (two little-endian int64 of
`time.perf_counter_ns`, the machine's monotonic clock, the same in every
process): the caller splits the round trip into its legs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np

SERVICE = "attnserve.bench.Echo"
_STAMPS = struct.Struct("<qq")  # the handler's start and end, ns


def request_for(payload: bytes, response_bytes: int) -> bytes:
    """A request that carries `payload` and asks for `response_bytes` back."""
    return response_bytes.to_bytes(4, "little") + payload


def _answer_size(request: bytes) -> int:
    return int.from_bytes(request[:4], "little")


def _stamped(answer: bytes, start_ns: int, size: int) -> bytes:
    """`answer` sized to `size` bytes (at least the stamps), its first 16 the stamps."""
    stamps = _STAMPS.pack(start_ns, time.perf_counter_ns())
    return stamps + answer[_STAMPS.size : size].ljust(size - _STAMPS.size, b"\0")


def _echo_answer(request: bytes, context: grpc.ServicerContext) -> bytes:
    return _stamped(b"", time.perf_counter_ns(), _answer_size(request))


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return _echo_answer(request, context)


class _ModelAnswer:
    """The `Model` methods: payload = a serialized EncodeRequest of one token-id input."""

    def __init__(self, model_dir: Path) -> None:
        from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions
        from attnserve.v1 import encoder_service_pb2 as pb

        self.runtime = OrtRuntime(model_dir, RuntimeOptions(provider="cpu"))
        self.runtime.warmup()
        self.parse = pb.EncodeRequest.FromString
        self.executor = ThreadPoolExecutor(max_workers=1)

    def _ids(self, request: bytes) -> np.ndarray:
        ids = self.parse(request[4:]).inputs[0].token_ids.ids
        return np.asarray(ids, dtype=np.int64)[None]  # (1, T)

    async def answer(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        start_ns = time.perf_counter_ns()
        loop = asyncio.get_running_loop()
        embeddings = await loop.run_in_executor(
            self.executor, self.runtime.embed, self._ids(request)
        )
        return _stamped(embeddings.tobytes(), start_ns, _answer_size(request))

    def answer_here(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """In the calling thread: the event loop's for ModelInline, gRPC's in --sync."""
        start_ns = time.perf_counter_ns()
        embeddings = self.runtime.embed(self._ids(request))
        return _stamped(embeddings.tobytes(), start_ns, _answer_size(request))

    async def answer_inline(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return self.answer_here(request, context)


_SERVER_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


async def _serve(ready_file: Path, model_dir: Path | None) -> None:
    methods = {"Echo": grpc.unary_unary_rpc_method_handler(_echo)}
    if model_dir is not None:
        model = _ModelAnswer(model_dir)
        methods["Model"] = grpc.unary_unary_rpc_method_handler(model.answer)
        methods["ModelInline"] = grpc.unary_unary_rpc_method_handler(model.answer_inline)
    server = grpc.aio.server(options=_SERVER_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ready_file.write_text(json.dumps({"port": port}))
    await server.wait_for_termination()


def _serve_sync(ready_file: Path, model_dir: Path | None) -> None:
    methods = {"Echo": grpc.unary_unary_rpc_method_handler(_echo_answer)}
    if model_dir is not None:
        methods["Model"] = grpc.unary_unary_rpc_method_handler(_ModelAnswer(model_dir).answer_here)
    # One handler thread: calls come one at a time, and ORT's pool does the parallel work.
    server = grpc.server(ThreadPoolExecutor(max_workers=1), options=_SERVER_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, methods),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    ready_file.write_text(json.dumps({"port": port}))
    server.wait_for_termination()


@dataclass(frozen=True)
class Legs:
    """One call's round trip outside its handler (seconds)."""

    to_handler: float  # from the caller's call to the handler's start
    back: float  # from the handler's end to the call's return


class EchoServer:
    """The echo server as a child process (grpc.aio, or grpc's thread-pool server when
    `sync`), and blocking calls to its methods; each call returns its Legs."""

    def __init__(
        self, model_dir: Path | None = None, sync: bool = False, timeout: float = 60
    ) -> None:
        ready = Path(tempfile.mkdtemp(prefix="attnserve-echo-")) / "ready.json"
        args = [sys.executable, str(Path(__file__).resolve()), "--ready-file", str(ready)]
        if model_dir is not None:
            args += ["--model", str(model_dir)]
        if sync:
            args.append("--sync")
        self.process = subprocess.Popen(args)
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("the echo server did not start")
            time.sleep(0.05)
        port = json.loads(ready.read_text())["port"]
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", -1)]
        )
        self._methods = {  # made once: a call's legs hold no set-up
            m: self.channel.unary_unary(f"/{SERVICE}/{m}") for m in ("Echo", "Model", "ModelInline")
        }

    def call(self, method: str, request: bytes) -> Legs:
        """`method`: Echo, Model or (not with --sync) ModelInline; bytes in, bytes out."""
        sent = time.perf_counter_ns()
        answer = self._methods[method](request)
        returned = time.perf_counter_ns()
        start, end = _STAMPS.unpack_from(answer)
        return Legs((start - sent) / 1e9, (returned - end) / 1e9)

    def close(self) -> None:
        if hasattr(self, "channel"):
            self.channel.close()
        self.process.terminate()
        self.process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ready-file", type=Path, required=True)
    parser.add_argument("--model", type=Path, help="also serve the Model methods with this model")
    parser.add_argument("--sync", action="store_true", help="grpc's thread-pool server, not aio")
    args = parser.parse_args()
    if args.sync:
        _serve_sync(args.ready_file, args.model)
    else:
        asyncio.run(_serve(args.ready_file, args.model))


if __name__ == "__main__":
    main()
