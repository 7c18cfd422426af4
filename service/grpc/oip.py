"""The Open Inference Protocol over gRPC: inference.GRPCInferenceService over OipProtocol.

Served on the same port as attnserve.v1, so that tritonclient, perf_analyzer and KServe's
platform talk to attnserve unmodified. This module only translates protobuf to and from
the model's Python values (service/oip/messages.py); errors become status codes
through handle_errors, and an unknown model is NOT_FOUND.
"""

from __future__ import annotations

import grpc
import numpy as np
from google.protobuf import json_format

from attnserve.oip import grpc_service_pb2 as oip
from attnserve.oip import grpc_service_pb2_grpc as oip_grpc
from attnserve.oip.wire import (
    BYTES,
    element_count,
    from_bytes,
    numpy_dtype,
    parameters_from_proto,
    unpack_bytes,
    write_parameter,
)
from attnserve.service.core.errors import InvalidInputError, ModelNotFoundError
from attnserve.service.grpc.utils import handle_errors
from attnserve.service.oip.messages import (
    InferRequest,
    InferResponse,
    InputTensor,
    RequestedOutput,
    wire_errors,
)
from attnserve.service.oip.model import OipProtocol

SERVICE_NAME = oip.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
# InferTensorContents' typed list of each numeric datatype the model reads.
CONTENTS_FIELDS = {"INT64": "int64_contents", "INT32": "int_contents", BYTES: "bytes_contents"}


class OipServicer(oip_grpc.GRPCInferenceServiceServicer):
    def __init__(self, oip_protocol: OipProtocol) -> None:
        self.oip_protocol = oip_protocol

    @handle_errors
    async def ServerLive(self, request, context) -> oip.ServerLiveResponse:
        return oip.ServerLiveResponse(live=True)

    @handle_errors
    async def ServerReady(self, request, context) -> oip.ServerReadyResponse:
        return oip.ServerReadyResponse(ready=self.oip_protocol.ready)

    @handle_errors
    async def ModelReady(self, request, context) -> oip.ModelReadyResponse:
        with self.oip_protocol.observed("ModelReady") as find:
            try:
                model = find(request.name, request.version)
            except ModelNotFoundError:
                return oip.ModelReadyResponse(ready=False)
            return oip.ModelReadyResponse(ready=model.ready)

    @handle_errors
    async def ServerMetadata(self, request, context) -> oip.ServerMetadataResponse:
        return json_format.ParseDict(
            self.oip_protocol.server_metadata(), oip.ServerMetadataResponse()
        )

    @handle_errors
    async def ModelMetadata(self, request, context) -> oip.ModelMetadataResponse:
        with self.oip_protocol.observed("ModelMetadata") as find:
            document = find(request.name, request.version).metadata()
            return json_format.ParseDict(document, oip.ModelMetadataResponse())

    @handle_errors
    async def ModelConfig(self, request, context) -> oip.ModelConfigResponse:
        with self.oip_protocol.observed("ModelConfig") as find:
            document = find(request.name, request.version).config()
            return json_format.ParseDict(document, oip.ModelConfigResponse())

    @handle_errors
    async def ModelStatistics(self, request, context) -> oip.ModelStatisticsResponse:
        with self.oip_protocol.observed("ModelStatistics") as find:
            model = find(request.name, request.version) if request.name else None
            document = self.oip_protocol.statistics(model)
            return json_format.ParseDict(document, oip.ModelStatisticsResponse())

    @handle_errors
    async def RepositoryIndex(self, request, context) -> oip.RepositoryIndexResponse:
        document = {"models": self.oip_protocol.index(request.ready)}
        return json_format.ParseDict(document, oip.RepositoryIndexResponse())

    @handle_errors
    async def RepositoryModelLoad(self, request, context) -> oip.RepositoryModelLoadResponse:
        await self.oip_protocol.load(request.model_name, parameters_from_proto(request.parameters))
        return oip.RepositoryModelLoadResponse()

    @handle_errors
    async def RepositoryModelUnload(self, request, context) -> oip.RepositoryModelUnloadResponse:
        await self.oip_protocol.unload(
            request.model_name, parameters_from_proto(request.parameters)
        )
        return oip.RepositoryModelUnloadResponse()

    @handle_errors
    async def SystemSharedMemoryRegister(self, request, context):
        registry = self.oip_protocol.shared_memory
        registry.register(request.name, request.key, request.offset, request.byte_size)
        return oip.SystemSharedMemoryRegisterResponse()

    @handle_errors
    async def SystemSharedMemoryUnregister(self, request, context):
        self.oip_protocol.shared_memory.unregister(request.name)
        return oip.SystemSharedMemoryUnregisterResponse()

    @handle_errors
    async def SystemSharedMemoryStatus(self, request, context):
        response = oip.SystemSharedMemoryStatusResponse()
        for r in self.oip_protocol.shared_memory.status(request.name):
            response.regions[r.name].CopyFrom(
                oip.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size
                )
            )
        return response

    @handle_errors
    async def ModelInfer(
        self, request: oip.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> oip.ModelInferResponse:
        with self.oip_protocol.observed("ModelInfer") as find:
            translated = infer_request(request)
            model = find(translated.model_name, translated.model_version)
            return infer_response(await model.infer(translated, context.time_remaining()))


def infer_request(message: oip.ModelInferRequest) -> InferRequest:
    """A ModelInferRequest as Python values; each input's bytes checked against its shape.
    The protocol: "If this field [raw_input_contents] is specified then
    InferInputTensor::contents must not be specified for any input tensor". Inputs in
    shared memory take no raw entry (as in Triton)."""
    with wire_errors():
        request = InferRequest(
            model_name=message.model_name,
            model_version=message.model_version,
            id=message.id,
            parameters=parameters_from_proto(message.parameters),
            outputs=[
                RequestedOutput(o.name, parameters_from_proto(o.parameters))
                for o in message.outputs
            ],
        )
        raw = list(message.raw_input_contents)
        tensors = [
            InputTensor(
                t.name, t.datatype, tuple(t.shape), None, parameters_from_proto(t.parameters)
            )
            for t in message.inputs
        ]
        on_the_wire = [i for i, t in enumerate(tensors) if not t.in_shared_memory]
        if raw and len(raw) != len(on_the_wire):
            raise InvalidInputError(
                f"raw_input_contents: {len(raw)} entries for the {len(on_the_wire)} inputs "
                "not in shared memory"
            )
        for i, tensor in enumerate(tensors):
            given = message.inputs[i]
            contents = given.contents if given.HasField("contents") else None
            if raw and contents is not None:
                raise InvalidInputError(
                    f"inputs[{i}].contents: must not be set when raw_input_contents is"
                )
            if raw and not tensor.in_shared_memory:
                contents = raw[on_the_wire.index(i)]
            if contents is not None:
                tensor.data = _input_data(tensor, contents, f"inputs[{i}]")
        request.inputs = tensors
    return request


def _input_data(tensor: InputTensor, contents: bytes | oip.InferTensorContents, field: str):
    element_count(tensor.shape, f"{field}.shape")
    if isinstance(contents, bytes):
        if tensor.datatype == BYTES:
            return unpack_bytes(contents, f"raw_input_contents of {field}")
        return from_bytes(contents, tensor.datatype, tensor.shape, f"raw_input_contents of {field}")
    typed = CONTENTS_FIELDS.get(tensor.datatype)
    if typed is None:
        raise InvalidInputError(
            f"{field}.contents: {tensor.datatype} is read from raw_input_contents only"
        )
    values = list(getattr(contents, typed))
    if tensor.datatype == BYTES:
        return values
    count = element_count(tensor.shape, f"{field}.shape")
    if len(values) != count:
        raise InvalidInputError(
            f"{field}.contents: shape {list(tensor.shape)} needs {count:,} {typed}, "
            f"got {len(values):,}"
        )
    return np.array(values, dtype=numpy_dtype(tensor.datatype, field)).reshape(tensor.shape)


def infer_response(answer: InferResponse) -> oip.ModelInferResponse:
    """The answer as a ModelInferResponse; each array's bytes once, in raw_output_contents
    (an output in shared memory has an empty entry: the entries keep the outputs' order)."""
    response = oip.ModelInferResponse(
        model_name=answer.model_name, model_version=answer.model_version, id=answer.id
    )
    for key, value in answer.parameters.items():
        write_parameter(response.parameters[key], value, f"parameters.{key}")
    for output in answer.outputs:
        tensor = response.outputs.add(
            name=output.name, datatype=output.datatype, shape=output.shape
        )
        for key, value in output.parameters.items():
            write_parameter(tensor.parameters[key], value, f"outputs.{key}")
        response.raw_output_contents.append(b"" if output.data is None else output.data.tobytes())
    return response
