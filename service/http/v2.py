"""The Open Inference Protocol (KServe V2) over HTTP: /v2 routes on the HTTP app.

A JSON body (or JSON and binary tensors, the protocol's binary data extension: the
`Inference-Header-Content-Length` header says how many bytes of the body are JSON)
becomes the same ModelInferRequest the gRPC transport gets, and goes through the same
V2Model (service/inference/model.py), data plane and batcher. Errors answer the protocol's
`{"error": "..."}` with the status of service/core/status.py's table.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

import numpy as np
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from attnserve.oip import grpc_service_pb2 as oip
from attnserve.service.core.errors import AttnserveError, InvalidInputError, ModelNotFoundError
from attnserve.service.http.errors import error_response
from attnserve.service.inference.model import SHM_REGION, V2Model

HEADER_LENGTH = "inference-header-content-length"
NUMPY = {"INT64": np.dtype("<i8"), "INT32": np.dtype("<i4"), "FP32": np.dtype("<f4")}
NUMPY["FP16"] = np.dtype("<f2")
# Parameters of the HTTP transport itself, not of the model.
BINARY_PARAMETERS = ("binary_data", "binary_data_size", "binary_data_output")


def v2_router(
    model: V2Model, deadline: Callable[[Request], float], dependencies: list
) -> APIRouter:
    """The protocol's routes over `model`; `deadline(request)`: the seconds a call may take."""
    router = APIRouter(prefix="/v2", tags=["open inference protocol (KServe V2)"])

    def error(exc: BaseException) -> JSONResponse:
        return error_response(router.prefix, exc)

    def guarded(build: Callable[[], dict]) -> JSONResponse:
        try:
            return JSONResponse(build())
        except AttnserveError as exc:
            return error(exc)

    @router.get("")
    async def server_metadata() -> dict:
        m = model.server_metadata()
        return {"name": m.name, "version": m.version, "extensions": list(m.extensions)}

    @router.get("/health/live")
    async def live() -> dict:
        return {"live": True}

    @router.get("/health/ready")
    async def ready() -> JSONResponse:
        if not model.ready:
            return JSONResponse({"error": model.dataplane.refusal}, 503)
        return JSONResponse({"ready": True})

    shm = "/systemsharedmemory"

    def regions(name: str = "") -> list[dict]:
        return [
            {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
            for r in model.shared_memory.status(name)
        ]

    @router.get(shm + "/status", dependencies=dependencies)
    async def shm_status() -> JSONResponse:
        return guarded(regions)

    @router.get(shm + "/region/{name}/status", dependencies=dependencies)
    async def shm_region_status(name: str) -> JSONResponse:
        return guarded(lambda: regions(name))

    @router.post(shm + "/region/{name}/register", dependencies=dependencies)
    async def shm_register(name: str, request: Request) -> JSONResponse:
        async def register() -> dict:
            body, _ = _split_body(await request.body(), {})
            fields = {"key": str, "offset": int, "byte_size": int}
            for field, kind in fields.items():
                if not isinstance(body.get(field, 0 if kind is int else None), kind):
                    raise InvalidInputError(f"{field}: a {kind.__name__} is required")
            model.shared_memory.register(
                name, body["key"], body.get("offset", 0), body["byte_size"]
            )
            return {}

        try:
            return JSONResponse(await register())
        except AttnserveError as exc:
            return error(exc)

    @router.post(shm + "/unregister", dependencies=dependencies)
    async def shm_unregister_all() -> JSONResponse:
        return guarded(lambda: model.shared_memory.unregister() or {})

    @router.post(shm + "/region/{name}/unregister", dependencies=dependencies)
    async def shm_unregister(name: str) -> JSONResponse:
        return guarded(lambda: model.shared_memory.unregister(name) or {})

    for versioned in ("", "/versions/{version}"):
        base = "/models/{name}" + versioned

        @router.get(base, dependencies=dependencies)
        async def model_metadata(name: str, version: str = "") -> JSONResponse:
            return guarded(lambda: _metadata_json(model.metadata(name, version)))

        @router.get(base + "/ready", dependencies=dependencies)
        async def model_ready(name: str, version: str = "") -> JSONResponse:
            try:
                model.check(name, version)
            except ModelNotFoundError as exc:
                return error(exc)
            if not model.ready:
                return JSONResponse({"error": model.dataplane.refusal}, 503)
            return JSONResponse({"name": name, "ready": True})

        @router.get(base + "/config", dependencies=dependencies)
        async def model_config(name: str, version: str = "") -> JSONResponse:
            return guarded(lambda: _config_json(model.config(name, version)))

        @router.get(base + "/stats", dependencies=dependencies)
        async def model_stats(name: str, version: str = "") -> JSONResponse:
            return guarded(lambda: _stats_json(model.statistics(name, version)))

        @router.post(base + "/infer", dependencies=dependencies)
        async def infer(request: Request, name: str, version: str = "") -> Response:
            try:
                with model.dataplane.observed("POST /v2/infer"):
                    body, binary = _split_body(await request.body(), request.headers)
                    infer_request, binary_outputs = _infer_request(body, binary, name, version)
                    response = await model.infer(infer_request, deadline(request))
                    return _infer_response(response, binary_outputs)
            except Exception as exc:
                return error(exc)

    return router


def _metadata_json(m: oip.ModelMetadataResponse) -> dict:
    def tensors(items) -> list[dict]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]

    return {
        "name": m.name,
        "versions": list(m.versions),
        "platform": m.platform,
        "inputs": tensors(m.inputs),
        "outputs": tensors(m.outputs),
    }


def _config_json(response: oip.ModelConfigResponse) -> dict:
    c = response.config

    def tensors(items) -> list[dict]:
        return [
            {"name": t.name, "data_type": oip.DataType.Name(t.data_type), "dims": list(t.dims)}
            for t in items
        ]

    return {
        "name": c.name,
        "platform": c.platform,
        "backend": c.backend,
        "max_batch_size": c.max_batch_size,
        "input": tensors(c.input),
        "output": tensors(c.output),
    }


def _stats_json(response: oip.ModelStatisticsResponse) -> dict:
    out = []
    for s in response.model_stats:
        durations = {
            field: {
                "count": getattr(s.inference_stats, field).count,
                "ns": getattr(s.inference_stats, field).ns,
            }
            for field in (
                "success",
                "fail",
                "queue",
                "compute_input",
                "compute_infer",
                "compute_output",
            )
        }
        out.append(
            {
                "name": s.name,
                "version": s.version,
                "last_inference": s.last_inference,
                "inference_count": s.inference_count,
                "execution_count": s.execution_count,
                "inference_stats": durations,
            }
        )
    return {"model_stats": out}


def _split_body(raw: bytes, headers) -> tuple[dict, bytes]:
    """The JSON part of the body, and the binary tensors after it (the extension)."""
    declared = headers.get(HEADER_LENGTH)
    if declared is None:
        header, binary = raw, b""
    else:
        try:
            length = int(declared)
        except ValueError:
            raise InvalidInputError(f"{HEADER_LENGTH}: not an integer: {declared!r}") from None
        if not 0 <= length <= len(raw):
            raise InvalidInputError(
                f"{HEADER_LENGTH}: {length} is outside the body's {len(raw)} bytes"
            )
        header, binary = raw[:length], raw[length:]
    try:
        body = json.loads(header)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"body: not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise InvalidInputError("body: must be a JSON object")
    return body, binary


def _parameter(message_map, key: str, value: object, field: str) -> None:
    target = message_map[key]
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise InvalidInputError(f"{field}.{key}: {value} is outside int64")
        target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    elif isinstance(value, str):
        target.string_param = value
    else:
        raise InvalidInputError(f"{field}.{key}: must be a bool, number or string")


def _infer_request(
    body: dict, binary: bytes, name: str, version: str
) -> tuple[oip.ModelInferRequest, set[str]]:
    """The ModelInferRequest a JSON body describes, and the outputs to answer in binary."""
    request = oip.ModelInferRequest(model_name=name, model_version=version)
    request.id = str(body.get("id", ""))
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInputError("parameters: must be a JSON object")
    for key, value in parameters.items():
        if key not in BINARY_PARAMETERS:
            _parameter(request.parameters, key, value, "parameters")
    all_binary = bool(parameters.get("binary_data_output", False))

    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidInputError("inputs: a non-empty list of tensors is required")
    offset = 0
    for i, tensor in enumerate(inputs):
        field = f"inputs[{i}]"
        if not isinstance(tensor, dict):
            raise InvalidInputError(f"{field}: must be a JSON object")
        shape = tensor.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            raise InvalidInputError(f"{field}.shape: a list of integers is required")
        datatype = str(tensor.get("datatype", ""))
        request.inputs.add(name=str(tensor.get("name", "")), datatype=datatype, shape=shape)
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise InvalidInputError(
                    f"{field}.parameters.binary_data_size: {size} overruns the "
                    f"{len(binary)} binary bytes after the JSON"
                )
            request.raw_input_contents.append(binary[offset : offset + size])
            offset += size
        else:
            request.raw_input_contents.append(_json_data(tensor.get("data"), datatype, field))

    binary_outputs = set()
    for i, output in enumerate(body.get("outputs") or []):
        if not isinstance(output, dict) or "name" not in output:
            raise InvalidInputError(f"outputs[{i}]: an object with a name is required")
        requested = request.outputs.add(name=str(output["name"]))
        output_parameters = output.get("parameters") or {}
        for key, value in output_parameters.items():
            if key not in BINARY_PARAMETERS:
                _parameter(requested.parameters, key, value, f"outputs[{i}].parameters")
        if all_binary or output_parameters.get("binary_data", False):
            binary_outputs.add(output["name"])
    if all_binary and not body.get("outputs"):
        binary_outputs.add("*")
    return request, binary_outputs


def _json_data(data: object, datatype: str, field: str) -> bytes:
    """A tensor's JSON `data` (nested or flat) as the protocol's raw bytes."""
    if data is None:
        raise InvalidInputError(f"{field}.data: required (or binary_data_size)")
    if datatype == "BYTES":
        items = data if isinstance(data, list) else [data]
        flat = list(_flatten(items))
        if not all(isinstance(item, str) for item in flat):
            raise InvalidInputError(f"{field}.data: BYTES elements must be strings")
        return b"".join(struct.pack("<I", len(b)) + b for b in (s.encode() for s in flat))
    if datatype not in NUMPY:
        return b""  # the translation refuses the datatype, naming the input
    try:
        return np.asarray(list(_flatten(data)), dtype=NUMPY[datatype]).tobytes()
    except (OverflowError, ValueError, TypeError) as exc:
        raise InvalidInputError(f"{field}.data: not {datatype} numbers ({exc})") from None


def _flatten(data: object):
    if isinstance(data, list):
        for item in data:
            yield from _flatten(item)
    else:
        yield data


def _infer_response(response: oip.ModelInferResponse, binary_outputs: set[str]) -> Response:
    outputs, chunks = [], []
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        item = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        if SHM_REGION in tensor.parameters:  # written into the client's region
            item["parameters"] = {
                key: getattr(value, value.WhichOneof("parameter_choice"))
                for key, value in tensor.parameters.items()
            }
        elif tensor.name in binary_outputs or "*" in binary_outputs:
            item["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            item["data"] = np.frombuffer(raw, dtype=NUMPY[tensor.datatype]).tolist()
        outputs.append(item)
    body = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "id": response.id,
        "parameters": {key: p.int64_param for key, p in response.parameters.items()},
        "outputs": outputs,
    }
    header = json.dumps(body).encode()
    if not chunks:
        return Response(header, media_type="application/json")
    return Response(
        header + b"".join(chunks),
        media_type="application/octet-stream",
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
