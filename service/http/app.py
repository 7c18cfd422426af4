"""The HTTP transport: OpenAI-compatible embeddings, the JSON mirror of Encode, health and
the attention explorer, served by uvicorn on the server's own event loop.

Like the gRPC servicer it only converts: JSON in, an `EncodeRequest` to the shared
data plane (so both transports share one batcher, one admission and one drain),
JSON out, and errors mapped through service/core/status.py's one table.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import socket
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, Literal

import numpy as np
import uvicorn
from fastapi import Body, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from google.protobuf import json_format
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from swagger_ui_bundle import swagger_ui_path

from attnserve.service.core.dataplane import DataPlane
from attnserve.service.core.errors import (
    AttnserveError,
    InvalidInputError,
    ModelNotFoundError,
    RequestTooLargeError,
    UnauthenticatedError,
)
from attnserve.service.http.errors import BodyLimit, FrameworkError, error_response
from attnserve.service.http.v2 import v2_router
from attnserve.service.inference.model import V2Model
from attnserve.service.settings import Settings
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import from_tensor

EXPLORER = resources.files("attnserve.service.http") / "static" / "explorer"
SWAGGER_ASSETS = "/docs/assets"  # Swagger UI's own files, from the swagger-ui-bundle-v2 package
POOLINGS = {"last": pb.POOLING_LAST, "mean": pb.POOLING_MEAN}
# EncodeResult's tensors: their name in protobuf's JSON mapping -> the field.
TENSOR_FIELDS = {
    "embeddings": "embeddings",
    "pooled": "pooled",
    "attention": "attention",
    "attentionIndices": "attention_indices",
    "headEntropy": "head_entropy",
}
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
DTYPE_NAMES = {pb.DTYPE_FLOAT32: "float32", pb.DTYPE_FLOAT16: "float16", pb.DTYPE_INT32: "int32"}


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request, as its official SDK sends it."""

    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="a text, a list of texts, a token array or a list of token arrays"
    )
    model: str | None = Field(None, description="the served model's name (GET /v1/models)")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="if given, must equal the model's d_model")
    user: str | None = None


def create_app(dataplane: DataPlane, settings: Settings, v2: V2Model | None = None) -> FastAPI:
    """The HTTP app; `v2` (shared with the gRPC transport) adds the protocol's /v2 routes."""
    config = dataplane.backend.config
    started = int(time.time())
    app = FastAPI(
        title="attnserve",
        description="Contextual embeddings and attention weights of a causal self-attention "
        "encoder. The same model and batcher as the gRPC API (attnserve.v1.EncoderService).",
        version=dataplane.backend.version,
        docs_url=None,  # FastAPI's pages load Swagger UI and ReDoc from a CDN: see /docs below
        redoc_url=None,
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type"],
        )
    app.add_middleware(BodyLimit, limit=settings.max_message_bytes)
    authorized = [Depends(_bearer_check(settings.auth_token))] if settings.auth_token else []

    async def answer(method: str, build: Callable[[], Awaitable[dict]]) -> JSONResponse:
        """Run one request; any error becomes OpenAI's error shape with the table's status."""
        try:
            with dataplane.observed(method):
                return JSONResponse(await build())
        except Exception as exc:
            return error_response("/v1", exc)

    def deadline(request: Request) -> float:
        """Seconds this call may take: the server's --http-timeout-s, or less if the client's
        Request-Timeout header says so (gRPC clients send their deadline the same way)."""
        given = request.headers.get("request-timeout")
        if given is None:
            return settings.http_timeout_s
        try:
            seconds = float(given)
        except ValueError:
            seconds = 0.0
        if not 0 < seconds < float("inf"):
            raise InvalidInputError(
                f"Request-Timeout: {given!r} is not a positive number of seconds"
            )
        return min(seconds, settings.http_timeout_s)

    @app.exception_handler(AttnserveError)
    async def refused(request: Request, exc: AttnserveError) -> JSONResponse:
        """Errors raised before a route runs (the bearer-token check)."""
        return error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}"
            for e in exc.errors()
        )
        return error_response(request.url.path, InvalidInputError(problems))

    @app.exception_handler(HTTPException)
    async def framework_error(request: Request, exc: HTTPException) -> JSONResponse:
        """The framework's own refusals (no such route, wrong method, a body it cannot read)
        in the API's error shape, with their status."""
        if exc.status_code == 413:
            return error_response(request.url.path, RequestTooLargeError(str(exc.detail)))
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if isinstance(exc.__cause__, UnicodeDecodeError):  # what FastAPI's 400 is about
            bad = exc.__cause__
            message = f"the body is not UTF-8 JSON: {bad.reason} at byte {bad.start}"
        if exc.status_code == 400:
            return error_response(request.url.path, InvalidInputError(message))
        return error_response(request.url.path, FrameworkError(exc.status_code, message))

    @app.get("/health", tags=["health"])
    async def ready() -> JSONResponse:
        """Readiness: 200 SERVING once the model is warm; 503 NOT_SERVING before and while
        draining (the states of the gRPC health service)."""
        if dataplane.refusal:
            return JSONResponse({"status": "NOT_SERVING", "reason": dataplane.refusal}, 503)
        return JSONResponse({"status": "SERVING"})

    @app.get("/health/live", tags=["health"])
    async def live() -> dict:
        """Liveness: 200 while the process answers at all."""
        return {"status": "ALIVE"}

    @app.get("/v1/models", tags=["openai"], dependencies=authorized)
    async def models() -> dict:
        """The one served model, as OpenAI's model list."""
        return {
            "object": "list",
            "data": [
                {"id": config.name, "object": "model", "created": started, "owned_by": "attnserve"}
            ],
        }

    @app.get("/v1/model-info", tags=["attnserve"], dependencies=authorized)
    async def model_info() -> dict:
        """`GetModelInfo` in JSON (protobuf's JSON mapping of GetModelInfoResponse): sizes,
        limits, and `kvHeads`, the key/value head each query head reads."""
        return json_format.MessageToDict(dataplane.model_info())

    @app.post("/v1/embeddings", tags=["openai"], dependencies=authorized)
    async def embeddings(body: EmbeddingsRequest, http: Request) -> JSONResponse:
        """One vector per input: the `--embeddings-pooling` of its token embeddings (default
        `last`: in a causal model only the last token has seen the whole input)."""

        async def build() -> dict:
            if body.model is not None and body.model != config.name:
                raise ModelNotFoundError(
                    f"model: no model {body.model!r}; this server serves {config.name!r}"
                )
            request = _embeddings_request(body, config.d_model, settings.embeddings_pooling)
            response = await dataplane.encode(request, deadline(http))
            data = []
            for index, result in enumerate(response.results):
                vector = from_tensor(result.pooled)
                embedding = (
                    base64.b64encode(vector.astype("<f4").tobytes()).decode()
                    if body.encoding_format == "base64"
                    else vector.tolist()
                )
                data.append({"object": "embedding", "index": index, "embedding": embedding})
            tokens = sum(len(r.token_ids) for r in response.results)
            return {
                "object": "list",
                "data": data,
                "model": config.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }

        return await answer("POST /v1/embeddings", build)

    @app.post("/v1/encode", tags=["attnserve"], dependencies=authorized)
    async def encode(
        http: Request,
        body: dict[str, Any] = Body(  # noqa: B008  (FastAPI's way to declare a JSON body)
            examples=[
                {
                    "inputs": [{"text": "The cat sat."}],
                    "options": {"pooling": "POOLING_MEAN", "attention": {"layers": [0]}},
                    "tensor_format": "list",
                }
            ]
        ),
    ) -> JSONResponse:
        """`Encode` in JSON: the body is protobuf's JSON mapping of attnserve.v1.EncodeRequest,
        the answer that of EncodeResponse. `"tensor_format": "list"` turns each tensor into
        `{"shape", "dtype", "values"}` (nested numbers); the default `"base64"` keeps the
        raw little-endian bytes of the gRPC API."""

        async def build() -> dict:
            request, as_lists = _encode_request(body)
            response = await dataplane.encode(request, deadline(http))
            return _encode_response(response, as_lists)

        return await answer("POST /v1/encode", build)

    if v2 is not None:
        app.include_router(v2_router(v2, deadline, authorized))

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        """Swagger UI from the installed swagger-ui-bundle-v2 package: it works offline."""
        return get_swagger_ui_html(
            openapi_url=str(app.openapi_url),
            title="attnserve: API docs",
            swagger_js_url=f"{SWAGGER_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{SWAGGER_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{SWAGGER_ASSETS}/favicon-32x32.png",
        )

    app.mount(SWAGGER_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui")

    @app.get("/", include_in_schema=False)
    async def explorer() -> FileResponse:
        return FileResponse(str(EXPLORER / "index.html"))

    app.mount("/explorer", StaticFiles(directory=str(EXPLORER)), name="explorer")
    return app


def _embeddings_request(body: EmbeddingsRequest, d_model: int, pooling: str) -> pb.EncodeRequest:
    if body.dimensions is not None and body.dimensions != d_model:
        raise InvalidInputError(
            f"dimensions: this model's embeddings have {d_model} dimensions, "
            f"{body.dimensions} were asked for"
        )
    items = body.input
    if isinstance(items, str) or (items and isinstance(items[0], int)):
        items = [items]
    if not items:
        raise InvalidInputError("input: at least one input is required")
    request = pb.EncodeRequest()
    for i, item in enumerate(items):
        if isinstance(item, str):
            request.inputs.add(text=item)
            continue
        try:
            request.inputs.add(token_ids=pb.TokenIds(ids=item))
        except ValueError:  # protobuf refuses what its int64 cannot hold
            token = next(t for t in item if not INT64_MIN <= t <= INT64_MAX)
            raise InvalidInputError(
                f"input[{i}]: token id {token} is out of range (token ids are int64)"
            ) from None
    request.options.pooling = POOLINGS[pooling]
    request.options.skip_token_embeddings = True
    return request


def _encode_request(body: dict[str, Any]) -> tuple[pb.EncodeRequest, bool]:
    body = dict(body)
    tensor_format = body.pop("tensor_format", body.pop("tensorFormat", "base64"))
    if tensor_format not in ("base64", "list"):
        raise InvalidInputError(f"tensor_format: {tensor_format!r} is not 'base64' or 'list'")
    try:
        request = json_format.ParseDict(body, pb.EncodeRequest())
    except json_format.ParseError as exc:
        raise InvalidInputError(f"not an attnserve.v1.EncodeRequest: {exc}") from None
    return request, tensor_format == "list"


def _encode_response(response: pb.EncodeResponse, as_lists: bool) -> dict:
    body = json_format.MessageToDict(response)
    if as_lists:
        for result, message in zip(body.get("results", []), response.results, strict=True):
            for json_name, field in TENSOR_FIELDS.items():
                if json_name in result:
                    result[json_name] = _tensor_as_list(getattr(message, field))
    return body


def _tensor_as_list(tensor: pb.Tensor) -> dict:
    array = from_tensor(tensor)
    return {
        "shape": list(array.shape),
        "dtype": DTYPE_NAMES.get(tensor.dtype, str(array.dtype)),
        "values": array.astype(np.float64 if array.dtype.kind == "f" else array.dtype).tolist(),
    }


def _bearer_check(token: str) -> Callable[[Request], None]:
    expected = f"Bearer {token}".encode()

    def check(request: Request) -> None:
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            raise UnauthenticatedError("missing or wrong 'Authorization: Bearer <token>' header")

    return check


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
            timeout_graceful_shutdown=settings.grace_seconds,
        )
        self._server = _EmbeddedUvicorn(config)
        self._task = None

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
