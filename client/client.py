"""EncoderClient (blocking) and AsyncEncoderClient (asyncio) for attnserve.v1.

    with EncoderClient("localhost:50051") as client:
        out = client.encode(["hello", "world"], attention=True, layers=[0], heads=[1, 2])
        out[0].embeddings      # (T, d_model) float32
        out[0].attention       # (1, 2, T, T) float32, whatever went over the wire

Retries only UNAVAILABLE (server starting, draining or unreachable), with
exponential backoff, inside the call's overall timeout.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attnserve.client.codec import EncodeOutput, parse_layers, parse_response
from attnserve.client.errors import request_error, request_errors
from attnserve.client.generation import GeneratedToken, build_generate_request, parse_token
from attnserve.client.graphs import build_graph_request, parse_graph
from attnserve.client.request import Input, array_head_mask, build_request, check_head_mask
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1 import encoder_service_pb2_grpc as pb_grpc

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Encode's and EncodeLayers' answers arrive as bytes (their large tensors read in place).
SERVICE = pb.DESCRIPTOR.services_by_name["EncoderService"].full_name
ENCODE, ENCODE_LAYERS = f"/{SERVICE}/Encode", f"/{SERVICE}/EncodeLayers"
# Targets that already name gRPC's resolver, e.g. "ipv4:10.0.0.1:50051,10.0.0.2:50051".
RESOLVER_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:")
# Round robin over the ready replicas that the standard health service reports SERVING
# (gRPC's client-side health checking): a draining replica leaves the pick list as soon as it
# reports NOT_SERVING, and one warming up joins once it is warm.
ROUND_ROBIN_CONFIG = json.dumps(
    {"loadBalancingConfig": [{"round_robin": {}}], "healthCheckConfig": {"serviceName": ""}}
)


@dataclass(frozen=True)
class ClientOptions:
    timeout_s: float = 30.0  # overall deadline of one call, retries included
    retries: int = 3  # extra attempts after a status of retry_codes
    # UNAVAILABLE: the server is starting, draining or gone. Behind Ray Serve add INTERNAL:
    # Ray's proxy answers the requests of a replica that died with it (every call of the
    # encoder is idempotent, so repeating one is safe).
    retry_codes: tuple[grpc.StatusCode, ...] = (grpc.StatusCode.UNAVAILABLE,)
    backoff_s: float = 0.05  # first retry delay; doubles each time, with jitter
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # match the server's limit
    tls_root_cert: Path | None = None  # PEM roots to trust; set to use TLS
    token: str | None = None  # sent as 'authorization: Bearer TOKEN'
    round_robin: bool = False  # spread calls over every address the target resolves to

    def open_channel(self, target: str, flavour: ModuleType) -> grpc.Channel | grpc.aio.Channel:
        """A channel from `flavour` (the grpc module, or grpc.aio) with these options."""
        if self.round_robin and not target.startswith(RESOLVER_SCHEMES):
            target = f"dns:///{target}"  # the dns resolver returns every address of the name
        credentials = self.credentials()
        if credentials:
            return flavour.secure_channel(target, credentials, options=self.channel_args())
        return flavour.insecure_channel(target, options=self.channel_args())

    def channel_args(self) -> list[tuple[str, object]]:
        args: list[tuple[str, object]] = [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
        ]
        if self.round_robin:
            args.append(("grpc.service_config", ROUND_ROBIN_CONFIG))
        return args

    def credentials(self) -> grpc.ChannelCredentials | None:
        if self.tls_root_cert is None:
            return None
        return grpc.ssl_channel_credentials(root_certificates=self.tls_root_cert.read_bytes())

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def retry_delays(self) -> Iterator[float]:
        for attempt in range(self.retries):
            yield self.backoff_s * 2**attempt * random.uniform(0.5, 1.5)


def _retry_delay(
    exc: grpc.RpcError, options: ClientOptions, delays: Iterator[float], end: float
) -> float | None:
    """Seconds to wait before another attempt, or None: a status not to retry, or out of
    tries or time."""
    if exc.code() not in options.retry_codes:
        return None
    delay = next(delays, None)
    if delay is None or time.monotonic() + delay >= end:
        return None
    return delay


def call_with_retries(options: ClientOptions, method, request, timeout: float | None):
    """A blocking unary call, retried on the options' retry codes within one deadline."""
    end = time.monotonic() + (timeout or options.timeout_s)
    delays = options.retry_delays()
    while True:
        try:
            return method(
                request, timeout=max(0.0, end - time.monotonic()), metadata=options.metadata()
            )
        except grpc.RpcError as exc:
            delay = _retry_delay(exc, options, delays, end)
            if delay is None:
                raise
            time.sleep(delay)


class EncoderClient:
    """Blocking client; one HTTP/2 channel, safe to share between threads."""

    def __init__(self, target: str = "localhost:50051", options: ClientOptions | None = None):
        self.options = options or ClientOptions()
        self.channel = self.options.open_channel(target, grpc)
        self._stub = pb_grpc.EncoderServiceStub(self.channel)
        self._encode = self.channel.unary_unary(
            ENCODE, request_serializer=pb.EncodeRequest.SerializeToString
        )
        self._encode_layers = self.channel.unary_stream(
            ENCODE_LAYERS, request_serializer=pb.EncodeLayersRequest.SerializeToString
        )
        self._infos: dict[str, dict] = {}  # model name -> model_info, for checks before sending

    def encode(
        self,
        inputs: Input | list[Input],
        timeout: float | None = None,
        unpack_attention: bool = True,
        **options,
    ) -> EncodeOutput:
        """Encode texts or token-id sequences; see attnserve.client.request.build_request.
        `unpack_attention=False` keeps causal-packed attention packed, as it came (half the
        memory and no copy; Encoding.unpacked_attention unpacks it when wanted)."""
        self._check(options, timeout)
        request = build_request(inputs, **options)
        return parse_response(self._call(self._encode, request, timeout), unpack_attention)

    def encode_layers(
        self, inputs: Input | list[Input], timeout: float | None = None, **options
    ) -> EncodeOutput:
        """encode, its attention weights streamed one layer per message (EncodeLayers): for
        maps too large to move or hold in one piece. Each Encoding's attention_by_layer holds
        them as received; no retries (a stream may have delivered part of the answer)."""
        self._check(options, timeout)
        request = pb.EncodeLayersRequest(request=build_request(inputs, **options))
        call = self._encode_layers(
            request, timeout=timeout or self.options.timeout_s, metadata=self.options.metadata()
        )
        with request_errors():
            return parse_layers(call)

    def encode_stream(
        self, requests: Iterable[pb.EncodeRequest], timeout: float | None = None
    ) -> Iterator[pb.EncodeStreamResponse]:
        """Send requests (see attnserve.client.request.build_request) on one stream; answers
        come back in request order, while the server works on several at once."""
        stream = (pb.EncodeStreamRequest(request=r) for r in requests)
        with request_errors():
            yield from self._stub.EncodeStream(
                stream, timeout=timeout or self.options.timeout_s, metadata=self.options.metadata()
            )

    def generate(
        self, prompt: Input, timeout: float | None = None, **options
    ) -> Iterator[GeneratedToken]:
        """A text's continuation token by token as the server makes them (see
        attnserve.client.generation.build_generate_request); leaving the loop early cancels
        the call, and the server stops generating. `timeout`: the whole call's (default: the
        options'); no retries (part of the text may have come)."""
        request = build_generate_request(prompt, **options)
        call = self._stub.Generate(
            request, timeout=timeout or self.options.timeout_s, metadata=self.options.metadata()
        )
        try:
            with request_errors():
                for message in call:
                    yield parse_token(message)
        finally:
            call.cancel()

    def graph(
        self,
        prompt: Input,
        transcoders: str,
        timeout: float | None = None,
        progress: Callable[[int, int], None] | None = None,
        **options,
    ) -> dict:
        """circuit-tracer's attribution graph of `prompt` with the transcoder set
        `transcoders` (options: circuit-tracer's arguments, see
        attnserve.client.graphs.build_graph_request): its graph file as a dict, with
        "scores" and, asked, "adjacency". `progress(rows, total)` after each backward pass.
        `timeout`: the whole call's (default: the options'); no retries."""
        request = build_graph_request(prompt, transcoders, **options)
        call = self._stub.Graph(
            request, timeout=timeout or self.options.timeout_s, metadata=self.options.metadata()
        )
        try:
            with request_errors():
                for message in call:
                    if message.HasField("result"):
                        return parse_graph(message.result)
                    if progress is not None:
                        progress(message.progress.rows, message.progress.total)
        finally:
            call.cancel()
        raise RuntimeError("the server ended the call without the graph")

    def model_info(self, timeout: float | None = None, model: str = "") -> dict:
        """The served model `model` (empty: the server's default), as numbers and names."""
        request = pb.GetModelInfoRequest(model=model)
        return info_dict(self._call(self._stub.GetModelInfo, request, timeout))

    def _check(self, options: dict, timeout: float | None) -> None:
        """A head mask given as an array checked against the model's shape (its info asked
        once per model)."""
        mask = array_head_mask(options)
        if mask is not None:
            model = str(options.get("model", ""))
            if model not in self._infos:
                self._infos[model] = self.model_info(timeout, model)
            check_head_mask(mask, self._infos[model])

    def health(self, service: str = "", timeout: float | None = None) -> str:
        """The standard health service's status: 'SERVING', 'NOT_SERVING', ..."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        request = health_pb2.HealthCheckRequest(service=service)
        response = self._call(stub.Check, request, timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def wait_until_serving(self, timeout: float = 60.0) -> None:
        """Poll health until SERVING; TimeoutError after `timeout` seconds."""
        end = time.monotonic() + timeout
        while True:
            try:
                if self.health(timeout=max(0.1, min(2.0, end - time.monotonic()))) == "SERVING":
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() >= end:
                raise TimeoutError(f"server not SERVING after {timeout:.0f}s")
            time.sleep(0.1)

    def _call(self, method, request, timeout: float | None):
        with request_errors():
            return call_with_retries(self.options, method, request, timeout)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> EncoderClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEncoderClient:
    """asyncio client with the same methods, awaited."""

    def __init__(self, target: str = "localhost:50051", options: ClientOptions | None = None):
        self.options = options or ClientOptions()
        self.channel = self.options.open_channel(target, grpc.aio)
        self._stub = pb_grpc.EncoderServiceStub(self.channel)
        self._encode = self.channel.unary_unary(
            ENCODE, request_serializer=pb.EncodeRequest.SerializeToString
        )
        self._encode_layers = self.channel.unary_stream(
            ENCODE_LAYERS, request_serializer=pb.EncodeLayersRequest.SerializeToString
        )
        self._infos: dict[str, dict] = {}  # model name -> model_info, for checks before sending

    async def encode(
        self,
        inputs: Input | list[Input],
        timeout: float | None = None,
        unpack_attention: bool = True,
        **options,
    ) -> EncodeOutput:
        await self._check(options, timeout)
        request = build_request(inputs, **options)
        return parse_response(await self._call(self._encode, request, timeout), unpack_attention)

    async def encode_layers(
        self, inputs: Input | list[Input], timeout: float | None = None, **options
    ) -> EncodeOutput:
        await self._check(options, timeout)
        request = pb.EncodeLayersRequest(request=build_request(inputs, **options))
        call = self._encode_layers(
            request, timeout=timeout or self.options.timeout_s, metadata=self.options.metadata()
        )
        with request_errors():
            return parse_layers([part async for part in call])

    async def encode_stream(
        self, requests: Iterable[pb.EncodeRequest], timeout: float | None = None
    ) -> AsyncIterator[pb.EncodeStreamResponse]:
        call = self._stub.EncodeStream(
            (pb.EncodeStreamRequest(request=r) for r in requests),
            timeout=timeout or self.options.timeout_s,
            metadata=self.options.metadata(),
        )
        with request_errors():
            async for response in call:
                yield response

    async def generate(
        self, prompt: Input, timeout: float | None = None, **options
    ) -> AsyncIterator[GeneratedToken]:
        call = self._stub.Generate(
            build_generate_request(prompt, **options),
            timeout=timeout or self.options.timeout_s,
            metadata=self.options.metadata(),
        )
        try:
            with request_errors():
                async for message in call:
                    yield parse_token(message)
        finally:
            call.cancel()

    async def model_info(self, timeout: float | None = None, model: str = "") -> dict:
        request = pb.GetModelInfoRequest(model=model)
        return info_dict(await self._call(self._stub.GetModelInfo, request, timeout))

    async def _check(self, options: dict, timeout: float | None) -> None:
        mask = array_head_mask(options)
        if mask is not None:
            model = str(options.get("model", ""))
            if model not in self._infos:
                self._infos[model] = await self.model_info(timeout, model)
            check_head_mask(mask, self._infos[model])

    async def health(self, service: str = "", timeout: float | None = None) -> str:
        """The standard health service's status: 'SERVING', 'NOT_SERVING', ..."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        request = health_pb2.HealthCheckRequest(service=service)
        response = await self._call(stub.Check, request, timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    async def wait_until_serving(self, timeout: float = 60.0) -> None:
        """Poll health until SERVING; TimeoutError after `timeout` seconds."""
        end = time.monotonic() + timeout
        while True:
            try:
                remaining = max(0.1, min(2.0, end - time.monotonic()))
                if await self.health(timeout=remaining) == "SERVING":
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() >= end:
                raise TimeoutError(f"server not SERVING after {timeout:.0f}s")
            await asyncio.sleep(0.1)

    async def _call(self, method, request, timeout: float | None):
        end = time.monotonic() + (timeout or self.options.timeout_s)
        delays = self.options.retry_delays()
        while True:
            try:
                return await method(
                    request,
                    timeout=max(0.0, end - time.monotonic()),
                    metadata=self.options.metadata(),
                )
            except grpc.RpcError as exc:
                delay = _retry_delay(exc, self.options, delays, end)
                if delay is None:
                    raise request_error(exc) from exc
                await asyncio.sleep(delay)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncEncoderClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def info_dict(response: pb.GetModelInfoResponse) -> dict:
    """GetModelInfo as plain Python: numbers as numbers (protobuf's JSON mapping writes int64
    as strings), repeated fields as lists, and the model config as an object under "config"
    rather than a JSON document inside a string."""
    info: dict = {}
    for field in response.DESCRIPTOR.fields:
        value = getattr(response, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            info[field.name] = dict(value)  # output_fidelity: {output: difference}
        elif field.message_type is not None:  # saes: each SAEInfo as a dict
            info[field.name] = [
                json_format.MessageToDict(m, preserving_proto_field_name=True) for m in value
            ]
        else:
            info[field.name] = value if isinstance(value, str | int | float) else list(value)
    info["config"] = json.loads(info.pop("config_json") or "{}")
    return info
