"""The Python gRPC floor: a bare grpc.aio server that answers any call with N fixed bytes.

It parses nothing and computes nothing, so a round trip to it costs what the
transport alone costs for the bytes an Encode call moves. `bench grpc` runs it
as its own process, like the real server, and compares:

    python -m attnserve.bench.echo --ready-file F   # writes {"port": P}, serves until killed

A call's method name is ignored; the request's first 4 bytes (little-endian)
say how many bytes to answer, so one server answers every sequence length.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

METHOD = "/attnserve.bench.Echo/Echo"


def request_for(payload: bytes, response_bytes: int) -> bytes:
    """A request that carries `payload` and asks for `response_bytes` back."""
    return response_bytes.to_bytes(4, "little") + payload


async def _answer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return bytes(int.from_bytes(request[:4], "little"))


async def _serve(ready_file: Path) -> None:
    handler = grpc.method_handlers_generic_handler(
        "attnserve.bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(_answer)}
    )
    server = grpc.aio.server(
        options=[("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ready_file.write_text(json.dumps({"port": port}))
    await server.wait_for_termination()


class EchoServer:
    """The echo server as a child process, and a blocking stub to call it with."""

    def __init__(self, timeout: float = 30) -> None:
        ready = Path(tempfile.mkdtemp(prefix="attnserve-echo-")) / "ready.json"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "attnserve.bench.echo", "--ready-file", str(ready)]
        )
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
        self.call = self.channel.unary_unary(METHOD)  # bytes in, bytes out

    def close(self) -> None:
        if hasattr(self, "channel"):
            self.channel.close()
        self.process.terminate()
        self.process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ready-file", type=Path, required=True)
    asyncio.run(_serve(parser.parse_args().ready_file))


if __name__ == "__main__":
    main()
