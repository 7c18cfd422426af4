"""The wire's floor: a bare gRPC server in its own process that answers N bytes.

No parsing, no protobuf, no model: a round trip to it costs what the transport alone costs
to move an answer of that size, the "echo" beside which the peers benchmark sets the
attention maps. The request is N as 8 little-endian bytes.

    python perf/echo.py --ready-file F     # writes its port to F once listening
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc

from attnserve.service.core.memory import KEEP_FREED_HEAP_ENV

METHOD = "/echo.Echo/Answer"
LIMIT = 2**31 - 1  # gRPC's largest message


async def _serve(ready_file: Path) -> None:
    answers: dict[int, bytes] = {}  # one object per size: the server only sends it

    async def answer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        (size,) = struct.unpack("<q", request)
        if size not in answers:
            answers.clear()
            answers[size] = bytes(size)
        return answers[size]

    options = [("grpc.max_send_message_length", LIMIT)]
    server = grpc.aio.server(options=options)
    handler = grpc.method_handlers_generic_handler(
        "echo.Echo", {"Answer": grpc.unary_unary_rpc_method_handler(answer)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ready_file.write_text(str(port))
    await server.wait_for_termination()


class Echo:
    """The echo server's client: `await echo.ms(n)`, one round trip of an n-byte answer."""

    def __init__(self, address: str) -> None:
        options = [("grpc.max_receive_message_length", LIMIT)]
        self.channel = grpc.aio.insecure_channel(address, options=options)
        self._call = self.channel.unary_unary(METHOD)

    async def ms(self, size: int) -> float:
        start = time.perf_counter()
        await self._call(struct.pack("<q", size))
        return (time.perf_counter() - start) * 1e3

    async def close(self) -> None:
        await self.channel.close()


@contextlib.contextmanager
def echo_server() -> Iterator[str]:
    """The echo server in its own process while the block runs: its address."""
    with tempfile.TemporaryDirectory() as scratch:
        ready = Path(scratch) / "port"
        command = [sys.executable, __file__, "--ready-file", str(ready)]
        # The floor's heap as attnserve's server keeps it: answers land in warm pages.
        process = subprocess.Popen(command, env={**os.environ, **KEEP_FREED_HEAP_ENV})
        try:
            deadline = time.monotonic() + 60
            while not ready.is_file() or not ready.read_text():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the echo server did not start")
                time.sleep(0.05)
            yield f"127.0.0.1:{ready.read_text()}"
        finally:
            process.terminate()
            process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ready-file", type=Path, required=True)
    asyncio.run(_serve(parser.parse_args().ready_file))


if __name__ == "__main__":
    main()
