"""The Open Inference Protocol (KServe V2) over HTTP: the /v2 routes, over OipProtocol
(service/oip/model.py); bodies are read and written by oip_codec.py. Errors answer
`{"error": "..."}` with the status of the one table (service/http/errors.py).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from attnserve.service.core.errors import InvalidInputError
from attnserve.service.http.errors import ErrorRoute
from attnserve.service.http.oip_codec import (
    infer_request,
    infer_response,
    json_parameters,
    split_body,
)
from attnserve.service.http.state import authorized, deadline, state
from attnserve.service.oip.model import OipProtocol

router = APIRouter(
    prefix="/v2", tags=["open inference protocol (KServe V2)"], route_class=ErrorRoute
)
protected = [Depends(authorized)]
SHM = "/systemsharedmemory"


def _oip_protocol(request: Request) -> OipProtocol:
    return state(request).oip_protocol


@router.get("")
async def server_metadata(request: Request) -> dict:
    return _oip_protocol(request).server_metadata()


@router.get("/health/live")
async def live() -> dict:
    return {"live": True}


@router.get("/health/ready")
async def ready(request: Request) -> JSONResponse:
    if not _oip_protocol(request).ready:
        return JSONResponse({"error": "not every model is ready"}, 503)
    return JSONResponse({"ready": True})


@router.get(SHM + "/status", dependencies=protected)
async def shm_status(request: Request) -> list[dict]:
    return _regions(_oip_protocol(request))


@router.get(SHM + "/region/{name}/status", dependencies=protected)
async def shm_region_status(name: str, request: Request) -> list[dict]:
    return _regions(_oip_protocol(request), name)


@router.post(SHM + "/region/{name}/register", dependencies=protected)
async def shm_register(name: str, request: Request) -> dict:
    body, _ = split_body(await request.body(), {})
    for key, kind in {"key": str, "offset": int, "byte_size": int}.items():
        value = body.get(key, 0 if key == "offset" else None)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise InvalidInputError(f"{key}: a {kind.__name__} is required, got {value!r}")
    _oip_protocol(request).shared_memory.register(
        name, body["key"], body.get("offset", 0), body["byte_size"]
    )
    return {}


@router.post(SHM + "/unregister", dependencies=protected)
async def shm_unregister_all(request: Request) -> dict:
    _oip_protocol(request).shared_memory.unregister()
    return {}


@router.post(SHM + "/region/{name}/unregister", dependencies=protected)
async def shm_unregister(name: str, request: Request) -> dict:
    _oip_protocol(request).shared_memory.unregister(name)
    return {}


def _regions(oip_protocol: OipProtocol, name: str = "") -> list[dict]:
    return [
        {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
        for r in oip_protocol.shared_memory.status(name)
    ]


@router.post("/repository/index", dependencies=protected)
async def repository_index(request: Request) -> list[dict]:
    """Every model of the repository, loaded or not; {"ready": true}: only the ready ones."""
    body, _ = split_body(await request.body() or b"{}", {})
    ready = body.get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidInputError(f"ready: must be a bool, got {ready!r}")
    return _oip_protocol(request).index(ready)


@router.post("/repository/models/{name}/load", dependencies=protected)
async def repository_load(name: str, request: Request) -> dict:
    """Load `name`, or reload it (its newest version), without downtime; answers once the
    new version serves."""
    body, _ = split_body(await request.body() or b"{}", {})
    await _oip_protocol(request).load(name, json_parameters(body.get("parameters"), "parameters"))
    return {}


@router.post("/repository/models/{name}/unload", dependencies=protected)
async def repository_unload(name: str, request: Request) -> dict:
    """Stop serving `name`; answers once its admitted requests are answered."""
    body, _ = split_body(await request.body() or b"{}", {})
    await _oip_protocol(request).unload(name, json_parameters(body.get("parameters"), "parameters"))
    return {}


for _base in ("/models/{name}", "/models/{name}/versions/{version}"):

    @router.get(_base, dependencies=protected)
    async def model_metadata(request: Request, name: str, version: str = "") -> dict:
        with _oip_protocol(request).observed("GET /v2/metadata") as find:
            return find(name, version).metadata()

    @router.get(_base + "/ready", dependencies=protected)
    async def model_ready(request: Request, name: str, version: str = "") -> JSONResponse:
        with _oip_protocol(request).observed("GET /v2/ready") as find:
            model = find(name, version)
            if not model.ready:
                return JSONResponse({"error": model.dataplane.refusal}, 503)
            return JSONResponse({"name": name, "ready": True})

    @router.get(_base + "/config", dependencies=protected)
    async def model_config(request: Request, name: str, version: str = "") -> dict:
        with _oip_protocol(request).observed("GET /v2/config") as find:
            return find(name, version).config()["config"]

    @router.get(_base + "/stats", dependencies=protected)
    async def model_stats(request: Request, name: str, version: str = "") -> dict:
        oip_protocol = _oip_protocol(request)
        with oip_protocol.observed("GET /v2/stats") as find:
            return oip_protocol.statistics(find(name, version))

    @router.post(_base + "/infer", dependencies=protected)
    async def infer(request: Request, name: str, version: str = "") -> Response:
        with _oip_protocol(request).observed("POST /v2/infer") as find:
            body, binary = split_body(await request.body(), request.headers)
            translated, binary_outputs = infer_request(body, binary, name, version)
            model = find(translated.model_name, translated.model_version)
            answer = await model.infer(translated, deadline(request))
            return infer_response(answer, binary_outputs)
