"""attnserve.v1 in JSON: POST /v1/encode and GET /v1/model-info, protobuf's JSON mapping of
the gRPC API's messages (the same data plane answers both), taking also what the OpenAI
endpoints take: an enum by its word ("add", "mean"), a float tensor as a plain list."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from fastapi import APIRouter, Body, Depends, Request
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from attnserve.service.core.errors import InvalidInputError
from attnserve.service.http.errors import ErrorRoute
from attnserve.service.http.state import authorized, deadline, state
from attnserve.service.v1.encode import encode as encode_v1
from attnserve.service.v1.encode import model_info as model_info_v1
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import fill_tensor, from_tensor

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
        request = json_format.ParseDict(
            _lenient(body, pb.EncodeRequest.DESCRIPTOR), pb.EncodeRequest()
        )
    except json_format.ParseError as exc:
        raise InvalidInputError(_parse_error(str(exc))) from None
    return request, tensor_format == "list"


def _lenient(value: Any, descriptor: Descriptor, path: str = "") -> Any:
    """`value`, the JSON of a `descriptor` message, with each enum given by its word made
    its name ("add": INTERVENTION_OP_ADD) and each float Tensor given as a list of numbers
    (one vector, or one row per position) made a Tensor's JSON."""
    if not isinstance(value, dict):
        return value
    fields = {f.name: f for f in descriptor.fields} | {f.json_name: f for f in descriptor.fields}
    out = dict(value)
    for key, item in value.items():
        field = fields.get(key)
        if field is None:
            continue
        where = f"{path}.{field.name}" if path else field.name
        if field.is_repeated and isinstance(item, list):
            out[key] = [_lenient_field(field, x, f"{where}[{i}]") for i, x in enumerate(item)]
        else:
            out[key] = _lenient_field(field, item, where)
    return out


def _lenient_field(field: FieldDescriptor, item: Any, path: str) -> Any:
    if field.enum_type is not None and isinstance(item, str):
        return _enum_name(field.enum_type, item, path)
    if field.message_type is pb.Tensor.DESCRIPTOR and isinstance(item, list):
        try:
            array = np.asarray(item, dtype=np.float32)
        except (TypeError, ValueError):
            raise InvalidInputError(
                f"{path}: a list of numbers, or of rows of numbers of one length"
            ) from None
        tensor = pb.Tensor()
        fill_tensor(tensor, array)
        return json_format.MessageToDict(tensor)
    if field.message_type is not None and not field.message_type.GetOptions().map_entry:
        return _lenient(item, field.message_type, path)
    return item


def _enum_name(enum: EnumDescriptor, word: str, path: str) -> str:
    """An enum value's name from its name or its word (the name's end, any case)."""
    if word in enum.values_by_name:
        return word
    prefix = enum.values[0].name.removesuffix("UNSPECIFIED")  # STANDARD lint's zero value
    if prefix + word.upper() in enum.values_by_name:
        return prefix + word.upper()
    words = [v.name.removeprefix(prefix).lower() for v in enum.values[1:]]
    raise InvalidInputError(f"{path}: {word!r} is not one of {', '.join(words)}")


def _parse_error(message: str) -> str:
    """protobuf's ParseError led by the field it is about, as every other refusal here:
    "options.interventions[0].op: Invalid enum value ...", not "Failed to parse options
    field: Failed to parse interventions field: ... at EncodeRequest.options....". The
    chain of "Failed to parse X field" names the fields, the trailing "at" their indices."""
    chain = re.findall(r"Failed to parse (\w+) field: ", message)
    detail = re.sub(r"^(Failed to parse \w+ field: )+", "", message)
    at = re.search(r' at "?EncodeRequest\.?([\w.\[\]]*?)"?\.*(\n|$)', detail)
    path = at.group(1) if at else ".".join(chain)
    if at:
        detail = detail[: at.start()]
    if chain and path.rsplit(".", 1)[-1].split("[")[0] != chain[-1]:
        path += f".{chain[-1]}"
    unknown = re.match(r'Message type "([\w.]+)" has no field named "(\w+)"', detail)
    if unknown:
        path, detail = (
            f"{path}.{unknown.group(2)}".lstrip("."),
            f"not a field of {unknown.group(1)}",
        )
    return (
        f"{path}: {detail.rstrip('.')}" if path else f"not an attnserve.v1.EncodeRequest: {detail}"
    )


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
