"""attnserve.v1 in JSON: POST /v1/encode and GET /v1/model-info, protobuf's JSON mapping of
the gRPC API's messages (the same data plane answers both)."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Body, Depends, Request
from google.protobuf import json_format
from google.protobuf.message import Message

from attnserve.service.core.errors import InvalidInputError
from attnserve.service.http.errors import ErrorRoute
from attnserve.service.http.state import authorized, deadline, state
from attnserve.service.v1.encode import encode as encode_v1
from attnserve.service.v1.encode import model_info as model_info_v1
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import from_tensor

router = APIRouter(
    prefix="/v1", tags=["attnserve"], route_class=ErrorRoute, dependencies=[Depends(authorized)]
)
DTYPE_NAMES = {pb.DTYPE_FLOAT32: "float32", pb.DTYPE_FLOAT16: "float16", pb.DTYPE_INT32: "int32"}
EXAMPLE = {
    "inputs": [{"text": "The cat sat."}],
    "options": {"pooling": "POOLING_MEAN", "attention": {"layers": [0]}},
    "tensor_format": "list",
}


@router.get("/model-info")
async def model_info(request: Request, model: str = "") -> dict:
    """`GetModelInfo` in JSON (protobuf's JSON mapping of GetModelInfoResponse) of `model`
    (default: the default model): sizes, limits, and `kvHeads`, the key/value head each
    query head reads."""
    with state(request).repository.observed("GET /v1/model-info") as find:
        return json_format.MessageToDict(model_info_v1(find(model)))


@router.post("/encode")
async def encode(
    request: Request,
    body: dict[str, Any] = Body(examples=[EXAMPLE]),  # noqa: B008  (FastAPI's JSON body)
) -> dict:
    """`Encode` in JSON: the body is protobuf's JSON mapping of attnserve.v1.EncodeRequest,
    the answer that of EncodeResponse. `"tensor_format": "list"` turns each tensor into
    `{"shape", "dtype", "values"}` (nested numbers); the default `"base64"` keeps the
    raw little-endian bytes of the gRPC API."""
    with state(request).repository.observed("POST /v1/encode") as find:
        encode_request, as_lists = _encode_request(body)
        timeout = deadline(request)
        plane = find(encode_request.model)
        return await encode_v1(
            plane, encode_request, timeout, lambda a: _encode_response(a.filled(), as_lists)
        )


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
            _tensors_as_lists(result, message)
    return body


def _tensors_as_lists(body: dict, message: Message) -> None:
    """Replace, in `body` (the JSON mapping of `message`), every Tensor by nested lists (a
    map's Tensors too: EncodeResult.activations)."""
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is pb.Tensor.DESCRIPTOR:
                body[field.json_name] = {k: _tensor_as_list(t) for k, t in value.items()}
            continue
        if field.message_type is None or field.is_repeated:
            continue
        if field.message_type is pb.Tensor.DESCRIPTOR:
            body[field.json_name] = _tensor_as_list(value)
        else:
            _tensors_as_lists(body[field.json_name], value)


def _tensor_as_list(tensor: pb.Tensor) -> dict:
    array = from_tensor(tensor)
    return {
        "shape": list(array.shape),
        "dtype": DTYPE_NAMES.get(tensor.dtype, str(array.dtype)),
        "values": array.astype(np.float64 if array.dtype.kind == "f" else array.dtype).tolist(),
    }
