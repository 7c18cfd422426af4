"""The Open Inference Protocol's HTTP body <-> the model's Python request and answer.

A JSON body (or JSON and binary tensors, the binary data extension: the
`Inference-Header-Content-Length` header says how many bytes of the body are JSON) becomes
the model's Python request (service/oip/messages.py): numpy arrays straight from the
JSON numbers or the binary bytes, no protobuf in between. Every field is checked against
the type the protocol gives it; nothing is coerced. The gRPC twin is
service/grpc/oip.py's infer_request and infer_response.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

import numpy as np
from fastapi import Response

from attnserve.oip.wire import (
    BYTES,
    Parameter,
    element_count,
    from_bytes,
    numpy_dtype,
    unpack_bytes,
)
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.fields import INT64
from attnserve.service.oip.messages import (
    InferRequest,
    InferResponse,
    InputTensor,
    RequestedOutput,
    wire_errors,
)

HEADER_LENGTH = "inference-header-content-length"
# Parameters of the HTTP transport itself (the binary data extension), not of the model.
BINARY_DATA, BINARY_DATA_SIZE, BINARY_DATA_OUTPUT = (
    "binary_data",
    "binary_data_size",
    "binary_data_output",
)


def split_body(raw: bytes, headers: Mapping[str, str]) -> tuple[dict, bytes]:
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


def _object(value: object, field: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInputError(f"{field}: must be a JSON object, got {value!r}")
    return value


def _string(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"{field}: must be a string, got {value!r}")
    return value


def json_parameters(value: object, field: str) -> dict[str, Parameter]:
    """$parameters: "a JSON object ... key/value pairs" whose values are booleans, numbers
    or strings."""
    parameters = _object(value, field)
    for key, item in parameters.items():
        if not isinstance(item, bool | int | float | str) or (
            isinstance(item, int) and item not in INT64
        ):
            raise InvalidInputError(
                f"{field}.{key}: a bool, an int64, a number or a string, got {item!r}"
            )
    return parameters


def _flag(parameters: dict[str, Parameter], key: str, field: str, default: bool = False) -> bool:
    """Take a bool parameter of the binary data extension out of `parameters`."""
    value = parameters.pop(key, default)
    if not isinstance(value, bool):
        raise InvalidInputError(f"{field}.{key}: must be a bool, got {value!r}")
    return value


def infer_request(
    body: dict, binary: bytes, name: str, version: str
) -> tuple[InferRequest, set[str]]:
    """The request a JSON body describes, and the outputs to answer in binary ("*": all)."""
    identifier = body.get("id", "")
    request = InferRequest(name, version, _string(identifier, "id"))
    request.parameters = json_parameters(body.get("parameters"), "parameters")
    all_binary = _flag(request.parameters, BINARY_DATA_OUTPUT, "parameters")

    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidInputError("inputs: a non-empty list of tensors is required")
    offset = 0
    for i, item in enumerate(inputs):
        tensor, size = _input(_object(item, f"inputs[{i}]"), f"inputs[{i}]")
        field = f"inputs[{i}]"
        if size is not None:
            if offset + size > len(binary):
                raise InvalidInputError(
                    f"{field}.parameters.{BINARY_DATA_SIZE}: {size} overruns the "
                    f"{len(binary)} binary bytes after the JSON"
                )
            tensor.data = _binary_data(binary[offset : offset + size], tensor, field)
            offset += size
        request.inputs.append(tensor)
    if offset != len(binary):
        raise InvalidInputError(
            f"body: {len(binary) - offset} binary bytes after the JSON belong to no input"
        )

    outputs = body.get("outputs")
    if outputs is not None and not isinstance(outputs, list):
        raise InvalidInputError("outputs: must be a list")
    binary_outputs = {"*"} if all_binary and not outputs else set()
    for i, item in enumerate(outputs or []):
        output = _object(item, f"outputs[{i}]")
        parameters = json_parameters(output.get("parameters"), f"outputs[{i}].parameters")
        requested = RequestedOutput(_string(output.get("name"), f"outputs[{i}].name"), parameters)
        # "If "binary_data" is specified on an output it overrides this setting."
        if _flag(parameters, BINARY_DATA, f"outputs[{i}].parameters", all_binary):
            binary_outputs.add(requested.name)
        request.outputs.append(requested)
    return request, binary_outputs


def _input(tensor: dict, field: str) -> tuple[InputTensor, int | None]:
    """An input's header and JSON data, and the size of its binary data if it has some."""
    shape = tensor.get("shape")
    if not isinstance(shape, list):
        raise InvalidInputError(f"{field}.shape: a list of integers is required")
    with wire_errors():
        element_count(shape, f"{field}.shape")
    parameters = json_parameters(tensor.get("parameters"), f"{field}.parameters")
    size = parameters.pop(BINARY_DATA_SIZE, None)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise InvalidInputError(
            f"{field}.parameters.{BINARY_DATA_SIZE}: a non-negative integer, got {size!r}"
        )
    result = InputTensor(
        _string(tensor.get("name"), f"{field}.name"),
        _string(tensor.get("datatype"), f"{field}.datatype"),
        tuple(shape),
        None,
        parameters,
    )
    if "data" in tensor:
        if size is not None:
            raise InvalidInputError(f"{field}.data: not with {BINARY_DATA_SIZE} as well")
        result.data = _json_data(tensor["data"], result, field)
    return result, size


def _flatten(data: object) -> Iterator[object]:
    if isinstance(data, list):
        for item in data:
            yield from _flatten(item)
    else:
        yield data


def _json_data(data: object, tensor: InputTensor, field: str) -> np.ndarray | list[bytes]:
    """A tensor's JSON `data`, nested or flat, as its array; elements of the wrong JSON type
    are refused, not converted."""
    flat = list(_flatten(data))
    count = element_count(tensor.shape, field)
    if len(flat) != count:
        raise InvalidInputError(
            f"{field}.data: shape {list(tensor.shape)} holds {count:,} elements, got {len(flat):,}"
        )
    if tensor.datatype == BYTES:
        texts = [item for item in flat if isinstance(item, str)]
        if len(texts) != len(flat):
            raise InvalidInputError(f"{field}.data: BYTES elements must be strings")
        return [text.encode() for text in texts]
    with wire_errors():
        dtype = numpy_dtype(tensor.datatype, f"{field}.datatype")
    for x in flat:
        if not _is_element(x, dtype.kind):
            raise InvalidInputError(f"{field}.data: {x!r} is not a {tensor.datatype} element")
    try:
        return np.array(flat, dtype=dtype).reshape(tensor.shape)
    except OverflowError:
        raise InvalidInputError(f"{field}.data: an element is outside {tensor.datatype}") from None


def _is_element(value: object, kind: str) -> bool:
    """Whether a JSON value is an element of a numpy kind: JSON's true is not the integer 1."""
    if kind == "b" or isinstance(value, bool):
        return kind == "b" and isinstance(value, bool)
    return isinstance(value, int) if kind in "iu" else isinstance(value, int | float)


def _binary_data(data: bytes, tensor: InputTensor, field: str) -> np.ndarray | list[bytes]:
    with wire_errors():
        if tensor.datatype == BYTES:
            return unpack_bytes(data, f"{field} (binary data)")
        return from_bytes(data, tensor.datatype, tensor.shape, f"{field} (binary data)")


def infer_response(answer: InferResponse, binary_outputs: set[str]) -> Response:
    outputs, chunks = [], []
    for tensor in answer.outputs:
        item: dict = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape}
        if tensor.data is None:  # written into the client's region
            item["parameters"] = tensor.parameters
        elif tensor.name in binary_outputs or "*" in binary_outputs:
            raw = tensor.data.tobytes()
            item["parameters"] = {BINARY_DATA_SIZE: len(raw)}
            chunks.append(raw)
        else:
            item["data"] = tensor.data.ravel().tolist()
        outputs.append(item)
    body = {
        "model_name": answer.model_name,
        "model_version": answer.model_version,
        "id": answer.id,
        "parameters": answer.parameters,
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
