"""Builds and runs the server: the models, the gRPC services (attnserve.v1, the Open
Inference Protocol, health, reflection), the HTTP app and metrics. The one place that composes them.

Lifecycle: load the models -> listen (health NOT_SERVING) -> warm up -> SERVING
(and the ready file, if asked for) -> on SIGTERM/SIGINT: NOT_SERVING, refuse
new requests, let in-flight ones finish within the grace period, drain the
engines, exit.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from wsgiref.simple_server import WSGIServer

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from attnserve.oip import grpc_service_pb2 as oip
from attnserve.oip import grpc_service_pb2_grpc as oip_grpc
from attnserve.service.core.backend import Backend
from attnserve.service.core.dataplane import DataPlane
from attnserve.service.core.engine import Engine
from attnserve.service.core.memory import keep_freed_heap
from attnserve.service.core.metrics import Metrics
from attnserve.service.core.repository import ModelRepository
from attnserve.service.grpc.auth import BearerTokenInterceptor
from attnserve.service.grpc.encoder import EncoderServicer, add_encoder_service
from attnserve.service.grpc.oip import SERVICE_NAME as OIP_SERVICE_NAME
from attnserve.service.grpc.oip import OipServicer
from attnserve.service.grpc.reflection import enable_reflection
from attnserve.service.http.app import create_app
from attnserve.service.http.server import HttpServer
from attnserve.service.models import load_models
from attnserve.service.oip.model import OipProtocol
from attnserve.service.oip.shared_memory import SharedMemoryRegistry
from attnserve.service.settings import Settings, env_name, flag_name
from attnserve.v1 import encoder_service_pb2 as pb

log = logging.getLogger(__name__)
T = TypeVar("T")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EncoderService"].full_name
# Draining ends when no request has come for this long (clients have moved on).
DRAIN_QUIET_S = 0.5
# Past the grace period: how long the streams of texts ended by the stop get to send their
# last message before the transports close.
STREAM_END_S = 2.0


@dataclass
class RunningServer:
    """A started server; `port` and `metrics_port` are the bound ones (useful with port 0)."""

    server: grpc.aio.Server
    repository: ModelRepository
    health: health.aio.HealthServicer
    metrics: Metrics
    port: int
    metrics_port: int | None
    http: HttpServer | None
    ready_file: Path | None
    _metrics_http: WSGIServer | None

    @property
    def http_port(self) -> int | None:
        return self.http.port if self.http else None

    @property
    def dataplane(self) -> DataPlane:
        """The default model's data plane (the only one, with --model)."""
        return self.repository.get()

    @property
    def engine(self) -> Engine:
        return self.dataplane.engine

    @property
    def backend(self) -> Backend:
        return self.dataplane.backend

    async def warm_up(self) -> None:
        """Run each model once per graph and a few lengths, then report SERVING."""
        await self.repository.warm_up()
        # Everything allocated so far (modules, sessions, the app) lives as long as the
        # process: move it out of the cyclic GC's reach, so that full collections under load
        # scan only what requests allocate.
        gc.collect()
        gc.freeze()
        for name in ("", SERVICE_NAME, OIP_SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.ready_file:
            ports = {"port": self.port, "metrics_port": self.metrics_port}
            _write_ready_file(self.ready_file, {**ports, "http_port": self.http_port})
        log.info("warm: SERVING %s", ", ".join(sorted(self.repository.served)))

    async def stop(self, grace: float) -> None:
        """Graceful: NOT_SERVING, new requests refused, in-flight ones get `grace` seconds.

        We drain before closing the transport so that new requests meet our own
        UNAVAILABLE ("shutting down", retry elsewhere) rather than a torn connection, and
        close it only once no request has come for DRAIN_QUIET_S: closing a gRPC server
        answers CANCELLED to the calls it has received but not yet started
        (grpc/grpc#41785), so it must close when none are on their way. Clients that watch
        the health service (attnserve's round robin does) stop sending at NOT_SERVING; an
        idle server closes at once.
        Past the grace period, texts being generated end first, with an error their
        stream carries (UNAVAILABLE; an error event on HTTP), then the rest is cancelled.
        """
        log.info("draining: refusing new requests, %.1fs for in-flight ones", grace)
        if self.ready_file:
            self.ready_file.unlink(missing_ok=True)
        self.repository.start_draining()
        await self.health.enter_graceful_shutdown()
        end = time.monotonic() + grace
        if await self.repository.wait_idle(grace):
            if not await self.repository.wait_quiet(DRAIN_QUIET_S, end - time.monotonic()):
                log.warning("grace period over with requests still arriving; closing")
        else:
            log.warning("grace period over with requests still in flight; cancelling them")
            await self.repository.stop_generating()
            await self.repository.wait_idle(STREAM_END_S)  # their last messages go out
        await self.server.stop(max(0.0, end - time.monotonic()))
        if self.http:
            await self.http.stop()
        await self.repository.stop()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
        log.info("stopped")


def _listening(name: str, settings: Settings, bind: Callable[[], T]) -> T:
    """bind(), or an OSError naming the setting whose port could not be listened on (a
    taken port says which of the three it was, and how to choose another)."""
    try:
        return bind()
    except (OSError, RuntimeError) as exc:  # grpc raises RuntimeError("Failed to bind ...")
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise OSError(
            getattr(exc, "errno", None) or errno.EADDRINUSE,
            f"cannot listen on {settings.host}:{getattr(settings, name)} for {flag_name(name)} "
            f"({detail}); choose another with {flag_name(name)} or {env_name(name)} "
            "(0 picks a free one)",
        ) from exc


def _write_ready_file(path: Path, ports: dict[str, int | None]) -> None:
    """{"pid", "port", "metrics_port", "http_port"} as JSON, renamed into place: readers
    never see half a file."""
    scratch = path.with_name(path.name + ".tmp")
    scratch.write_text(json.dumps({"pid": os.getpid(), **ports}) + "\n")
    scratch.replace(path)


@dataclass(frozen=True)
class Services:
    """What a server serves, whatever its front ends (this module's, or Ray Serve's): the
    models, and the transport-free protocol and servicers each API mounts."""

    repository: ModelRepository
    oip_protocol: OipProtocol
    encoder: EncoderServicer
    oip: OipServicer


async def compose(
    settings: Settings,
    backend: Backend | None = None,
    shared_memory: SharedMemoryRegistry | None = None,
    repository_api: bool = True,
) -> Services:
    """The models of `settings` built (with --model, `backend` if given; not yet warm) and
    the services over them. `repository_api` False: no loads or unloads (Ray Serve)."""
    repository = await load_models(settings, backend)
    oip_protocol = OipProtocol(repository, shared_memory or SharedMemoryRegistry(), repository_api)
    return Services(
        repository, oip_protocol, EncoderServicer(repository), OipServicer(oip_protocol)
    )


async def _grpc_server(
    settings: Settings, services: Services
) -> tuple[grpc.aio.Server, health.aio.HealthServicer]:
    """The gRPC server with attnserve.v1, the Open Inference Protocol beside it over the
    same models, health (NOT_SERVING until warmed up) and reflection."""
    limits = [
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
    ]
    interceptors = [BearerTokenInterceptor(settings.auth_token)] if settings.auth_token else []
    server = grpc.aio.server(options=limits, interceptors=interceptors)
    add_encoder_service(services.encoder, server)
    # The Open Inference Protocol (KServe V2) beside attnserve.v1, over the same models.
    oip_grpc.add_GRPCInferenceServiceServicer_to_server(services.oip, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_reflection(
        server,
        [
            pb.DESCRIPTOR.services_by_name["EncoderService"],
            oip.DESCRIPTOR.services_by_name["GRPCInferenceService"],
            health_pb2.DESCRIPTOR.services_by_name["Health"],
        ],
    )
    for name in ("", SERVICE_NAME, OIP_SERVICE_NAME):  # "": the whole server, as probes ask
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    return server, health_servicer


async def start_server(
    settings: Settings, backend: Backend | None = None, warm_up: bool = True
) -> RunningServer:
    """Load the models (with --model, `backend` if given), listen (NOT_SERVING), then warm
    up and report SERVING."""
    if settings.release_memory:  # the heap keeps what answers free, trimmed after bursts
        keep_freed_heap()
    services = await compose(settings, backend)
    repository, oip_protocol = services.repository, services.oip_protocol
    metrics = repository.metrics
    server, health_servicer = await _grpc_server(settings, services)
    address = f"{settings.host}:{settings.port}"
    if settings.tls_cert and settings.tls_key:
        credentials = grpc.ssl_server_credentials(
            [(settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())]
        )
        port = _listening("port", settings, lambda: server.add_secure_port(address, credentials))
    else:
        port = _listening("port", settings, lambda: server.add_insecure_port(address))
    metrics_http = None
    if settings.metrics_port >= 0:
        metrics_http = _listening(
            "metrics_port", settings, lambda: metrics.serve(settings.metrics_port, settings.host)
        )
    http = None
    if settings.http_port >= 0:
        app = create_app(repository, settings, oip_protocol)
        http = _listening("http_port", settings, lambda: HttpServer(app, settings))
    await server.start()
    if http:
        http.start()

    metrics_port = metrics_http.server_port if metrics_http else None
    log.info(
        "listening: %s (%s) on %s:%d%s; HTTP (explorer, /v1/embeddings, /docs) on %s; "
        "metrics on %s",
        SERVICE_NAME,
        ", ".join(f"{d.name} {d.version} ({d.view.provider})" for d in repository.served.values()),
        settings.host,
        port,
        " with TLS" if settings.tls_cert else "",
        f"{'https' if settings.tls_cert else 'http'}://{settings.host}:{http.port}/"
        if http
        else "(off)",
        f"port {metrics_port}" if metrics_port else "(off)",
    )
    running = RunningServer(
        server,
        repository,
        health_servicer,
        metrics,
        port,
        metrics_port,
        http,
        settings.ready_file,
        metrics_http,
    )
    if warm_up:
        await running.warm_up()
    return running


async def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    running = await start_server(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await running.stop(settings.grace_seconds)
