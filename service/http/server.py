"""uvicorn inside the server's own event loop, serving the HTTP app."""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket

import uvicorn
from fastapi import FastAPI

from attnserve.service.settings import Settings


class HttpServer:
    """uvicorn inside the running event loop, on a socket bound before it starts (so a
    port taken is an OSError at start-up, and port 0 is known at once)."""

    def __init__(self, app: FastAPI, settings: Settings) -> None:
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        self.socket = socket.create_server((settings.host, settings.http_port), family=family)
        # Without TCP_NODELAY a keep-alive client waits out its delayed ACK (~40 ms) for every
        # body that uvicorn writes apart from its headers. asyncio sets it only on sockets it
        # made itself (proto IPPROTO_TCP, not create_server's 0); Linux accepted sockets
        # inherit it from the listener.
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.port = self.socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            lifespan="off",
            access_log=False,
            log_level="warning",
            ssl_certfile=settings.tls_cert,
            ssl_keyfile=settings.tls_key,
            timeout_graceful_shutdown=math.ceil(settings.grace_seconds),
        )
        self._server = _EmbeddedUvicorn(config)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._server.serve(sockets=[self.socket]), name="http"
        )

    def connections(self) -> list:
        """The open HTTP connections (uvicorn protocol objects)."""
        return list(self._server.server_state.connections)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task:
            await self._task


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the gRPC server's handler drains both."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield
