"""attnserve as a Ray Serve application: each replica serves the models with the same data
plane, batcher and ONNX Runtime backend as `attnserve serve`, behind Ray's own proxies.

HTTP: Ray's HTTP proxy serves the project's FastAPI app (service/http/app.py) at the same
paths (/v1/embeddings, /v1/encode, /v2/..., the explorer). gRPC: Ray's gRPC proxy takes the
project's generated servicers (deploy/ray/serve.yaml lists them) and calls the methods of
the same name on a replica, which hands them to the project's own servicers
(service/grpc/), so errors keep their status codes. Ray places, routes, health-checks,
restarts and autoscales the replicas; nothing here does any of that.

    serve run deploy/ray/serve.yaml      # `build` below, with the file's arguments
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from ray import serve
from ray.serve import Application

from attnserve.oip import grpc_service_pb2 as oip
from attnserve.oip import grpc_service_pb2_grpc as oip_grpc
from attnserve.service.core.errors import NotReadyError
from attnserve.service.http.app import create_app
from attnserve.service.oip.shared_memory import SharedMemoryRegistry
from attnserve.service.server import compose
from attnserve.service.settings import Settings
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1 import encoder_service_pb2_grpc as pb_grpc

# Each replica runs the project's code on Ray's own event loop, not on a second loop in
# another thread: the code never blocks its loop (ONNX Runtime runs on the batcher's
# threads), and the hop between the two loops cost 4-5 ms a request here (BENCHMARKS.md).
REPLICA_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}
# What Serve's gRPC proxy registers: the project's generated add_*_to_server functions, by
# import path (deploy/ray/serve.yaml lists the same; tests/service/ray checks it does).
GRPC_SERVICERS = [
    f"{function.__module__}.{function.__name__}"
    for function in (
        pb_grpc.add_EncoderServiceServicer_to_server,
        oip_grpc.add_GRPCInferenceServiceServicer_to_server,
    )
]


class RayContext:
    """What attnserve's servicers ask of a grpc.aio context, over a Ray Serve gRPC context:
    an abort sets the status code, details and trailers (the rich status naming the field)
    that Ray's proxy answers with."""

    def __init__(self, context: Any) -> None:
        self._context = context

    def time_remaining(self) -> float | None:
        return None  # Ray's proxy holds the deadline (grpc_options.request_timeout_s)

    async def abort(
        self, code: grpc.StatusCode, details: str, trailing_metadata: tuple = ()
    ) -> None:
        self._context.set_code(code)
        self._context.set_details(details)
        if trailing_metadata:
            self._context.set_trailing_metadata(trailing_metadata)
        raise grpc.aio.AbortError(details)


def actor_options(num_cpus: float = 1) -> dict[str, Any]:
    """A replica's Ray actor options: its CPUs and REPLICA_ENV."""
    return {"num_cpus": num_cpus, "runtime_env": {"env_vars": REPLICA_ENV}}


# Deleting the application lets a replica finish what it admitted for this long before Ray
# kills it; Ray's default, 20 s, is shorter than a long request on a busy CPU: a call's
# default deadline (Settings.http_timeout_s) instead.
GRACEFUL_SHUTDOWN_S = 60.0


@serve.deployment(
    name="Encoder",
    ray_actor_options=actor_options(),
    graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
)
@serve.ingress()
class Encoder:
    """One replica: the models of `settings` (Settings' fields, as `attnserve serve` takes
    them), warm before Ray routes to it."""

    # Ray Serve awaits an async constructor; type checkers want __init__ to return None.
    async def __init__(self, **settings: Any) -> None:  # type: ignore[misc]
        fields: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "http_port": -1}
        fields["metrics_port"] = -1  # Ray's proxies serve, and Ray exports its own metrics
        for key in ("model", "model_repository"):
            if settings.get(key):
                settings[key] = Path(settings[key])
        self.settings = Settings(**(fields | settings))
        # No shared memory (a region lives on one host) and no loads (they would reach one
        # replica of many).
        services = await compose(self.settings, None, SharedMemoryRegistry(root=None), False)
        self.repository, self.oip_protocol = services.repository, services.oip_protocol
        self.encoder, self.oip = services.encoder, services.oip
        await self.repository.warm_up()

    def __serve_build_asgi_app__(self):
        return create_app(self.repository, self.settings, self.oip_protocol)

    async def check_health(self) -> None:
        """Ray's health check: a replica whose models are not all serving is unhealthy."""
        if not self.repository.ready:
            raise NotReadyError("not every model is serving")

    # attnserve.v1.EncoderService (the streams too: Ray's proxy streams both ways).

    # Ray's proxy serializes messages itself: the answers the servicer serializes for grpc
    # (spliced, service/v1/response.py) are handed over as messages.

    async def Encode(self, request: pb.EncodeRequest, grpc_context: Any) -> pb.EncodeResponse:
        return pb.EncodeResponse.FromString(
            await self.encoder.Encode(request, RayContext(grpc_context))
        )

    async def EncodeStream(
        self, request_iterator: AsyncIterator[pb.EncodeStreamRequest], grpc_context: Any
    ) -> AsyncIterator[pb.EncodeStreamResponse]:
        async for answer in self.encoder.EncodeStream(request_iterator, RayContext(grpc_context)):
            yield pb.EncodeStreamResponse.FromString(answer)

    async def EncodeLayers(
        self, request: pb.EncodeLayersRequest, grpc_context: Any
    ) -> AsyncIterator[pb.EncodeLayersResponse]:
        async for part in self.encoder.EncodeLayers(request, RayContext(grpc_context)):
            yield pb.EncodeLayersResponse.FromString(part)

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, grpc_context: Any
    ) -> pb.GetModelInfoResponse:
        return await self.encoder.GetModelInfo(request, RayContext(grpc_context))

    # inference.GRPCInferenceService: health, metadata and inference (the repository and
    # shared-memory calls stay with the single server: a region lives on one host, and a
    # load would reach one replica of many).

    async def ServerLive(self, request, grpc_context: Any) -> oip.ServerLiveResponse:
        return await self.oip.ServerLive(request, RayContext(grpc_context))

    async def ServerReady(self, request, grpc_context: Any) -> oip.ServerReadyResponse:
        return await self.oip.ServerReady(request, RayContext(grpc_context))

    async def ModelReady(self, request, grpc_context: Any) -> oip.ModelReadyResponse:
        return await self.oip.ModelReady(request, RayContext(grpc_context))

    async def ServerMetadata(self, request, grpc_context: Any) -> oip.ServerMetadataResponse:
        return await self.oip.ServerMetadata(request, RayContext(grpc_context))

    async def ModelMetadata(self, request, grpc_context: Any) -> oip.ModelMetadataResponse:
        return await self.oip.ModelMetadata(request, RayContext(grpc_context))

    async def ModelInfer(
        self, request: oip.ModelInferRequest, grpc_context: Any
    ) -> oip.ModelInferResponse:
        return await self.oip.ModelInfer(request, RayContext(grpc_context))


def build(args: dict[str, Any]) -> Application:
    """The application `serve run` and `serve deploy` build from a config's `args`: the
    settings of `attnserve serve` by field name, e.g. {"model": "models/default"}. Relative
    model paths are taken from where the application is built."""
    for key in ("model", "model_repository"):
        if args.get(key):
            args = args | {key: str(Path(args[key]).resolve())}
    # serve.deployment made the class a Deployment, which type checkers cannot see.
    return Encoder.bind(**args)  # type: ignore[attr-defined]
