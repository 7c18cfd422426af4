"""Would a large map move faster as one message per layer? A bare gRPC server in its own
process answers 283 MB (SmolLM2-135M's float16 causal-packed map at 1024 tokens) as one
unary message, as the peers benchmark's echo does, and as a stream of 30 messages (one per
layer); the client keeps what it receives. Prints the p50 of the calls after the first,
and the client process's page faults per call.

    .venv/bin/python research/per-request-path/stream_echo.py
"""

from __future__ import annotations

import asyncio
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np

LIMIT = 2**31 - 1
SIZE, LAYERS, CALLS = 283 * 10**6, 30, 5


async def serve(ready_file: Path) -> None:
    answers: dict[tuple[int, int], bytes] = {}  # one object per shape: the server only sends

    def answer(size: int, parts: int) -> bytes:
        if (size, parts) not in answers:
            answers.clear()
            answers[size, parts] = bytes(size // parts)
        return answers[size, parts]

    async def whole(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return answer(*struct.unpack("<qq", request))

    async def by_layer(request: bytes, context: grpc.aio.ServicerContext):
        size, parts = struct.unpack("<qq", request)
        for _ in range(parts):
            yield answer(size, parts)

    server = grpc.aio.server(options=[("grpc.max_send_message_length", LIMIT)])
    handlers = {
        "Whole": grpc.unary_unary_rpc_method_handler(whole),
        "ByLayer": grpc.unary_stream_rpc_method_handler(by_layer),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("echo.Echo", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ready_file.write_text(str(port))
    await server.wait_for_termination()


async def measure(port: int) -> None:
    options = [("grpc.max_receive_message_length", LIMIT)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
        whole = channel.unary_unary("/echo.Echo/Whole")
        by_layer = channel.unary_stream("/echo.Echo/ByLayer")

        async def receive(parts: int) -> list[bytes]:
            request = struct.pack("<qq", SIZE, parts)
            if parts == 1:
                return [await whole(request)]
            return [message async for message in by_layer(request)]

        for parts in (1, LAYERS):
            times, faults = [], 0
            for i in range(CALLS):
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                start = time.perf_counter()
                received = await receive(parts)
                if i:  # the first call sets the connection's windows up
                    times.append(time.perf_counter() - start)
                    faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
                assert sum(map(len, received)) == SIZE // parts * parts
                del received
            print(
                f"{SIZE / 1e6:.0f} MB in {parts:2d} message(s): p50 {np.median(times):.2f} s, "
                f"{faults / len(times):7.0f} page faults per call in the client"
            )


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "serve":
        asyncio.run(serve(Path(sys.argv[2])))
        return
    with tempfile.TemporaryDirectory() as work:
        ready = Path(work) / "port"
        server = subprocess.Popen([sys.executable, __file__, "serve", str(ready)])
        try:
            while not (ready.exists() and ready.read_text()):
                time.sleep(0.05)
            asyncio.run(measure(int(ready.read_text())))
        finally:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
