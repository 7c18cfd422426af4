"""The Open Inference Protocol (KServe V2) over gRPC: inference.GRPCInferenceService.

Served on the same port as attnserve.v1, over the same data plane (service/inference/tensors.py
translates the tensors), so that tritonclient, perf_analyzer and KServe's platform talk
to attnserve unmodified. Errors map to status codes through the one table
(service/core/status.py); an unknown model is NOT_FOUND.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from importlib import metadata

import grpc
import numpy as np

from attnserve.oip import grpc_service_pb2 as oip
from attnserve.oip import grpc_service_pb2_grpc as oip_grpc
from attnserve.service.core.dataplane import DataPlane
from attnserve.service.core.errors import AttnserveError, InvalidInputError, ModelNotFoundError
from attnserve.service.core.status import status_for
from attnserve.service.inference.shared_memory import SharedMemoryRegistry
from attnserve.service.inference.tensors import (
    INPUTS,
    OUTPUT_DATATYPES,
    datatype_of,
    output_rows,
    stack_into,
    stacked_shape,
    to_encode_request,
)

V2_VERSION = "1"  # the one version served
SERVICE_NAME = oip.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
PLATFORM = "onnxruntime_onnx"
EXTENSIONS = ["model_configuration", "statistics", "system_shared_memory", "binary_tensor_data"]
SHM_REGION, SHM_OFFSET, SHM_SIZE = (
    "shared_memory_region",
    "shared_memory_offset",
    "shared_memory_byte_size",
)
_CONFIG_TYPES = {"INT64": oip.TYPE_INT64, "INT32": oip.TYPE_INT32, "FP32": oip.TYPE_FP32}
_CONFIG_TYPES |= {"FP16": oip.TYPE_FP16, "BYTES": oip.TYPE_STRING}


@dataclass
class _Statistics:
    """Counts and durations of ModelInfer calls (Triton's statistics extension)."""

    success: int = 0
    success_ns: int = 0
    fail: int = 0
    fail_ns: int = 0
    queue_ns: int = 0
    input_ns: int = 0  # translating the request into an Encode request
    infer_ns: int = 0
    output_ns: int = 0  # writing the outputs (into the answer or shared memory)
    sequences: int = 0
    last_ms: int = 0


class V2Model:
    """The served model as the protocol sees it; both transports (gRPC here, HTTP in
    service/http/app.py) call it. Errors are the service's typed ones."""

    def __init__(self, dataplane: DataPlane, shared_memory: SharedMemoryRegistry) -> None:
        self.dataplane = dataplane
        self.shared_memory = shared_memory
        self.stats = _Statistics()

    @property
    def name(self) -> str:
        return self.dataplane.backend.config.name

    @property
    def version(self) -> str:
        """ "1": Triton's tools (perf_analyzer) read versions as integers. The weights' hash,
        attnserve.v1's model_version, names the same version too."""
        return V2_VERSION

    @property
    def ready(self) -> bool:
        return self.dataplane.refusal is None

    def check(self, name: str, version: str = "") -> None:
        """ModelNotFoundError unless `name` (and `version`, if given) is the served model."""
        if name != self.name or version not in ("", V2_VERSION, self.dataplane.backend.version):
            raise ModelNotFoundError(
                f"model_name: no model {name!r}"
                + (f" version {version!r}" if version else "")
                + f"; this server serves {self.name!r} version {self.version!r}"
            )

    def server_metadata(self) -> oip.ServerMetadataResponse:
        return oip.ServerMetadataResponse(
            name="attnserve", version=metadata.version("attnserve"), extensions=EXTENSIONS
        )

    def metadata(self, name: str, version: str = "") -> oip.ModelMetadataResponse:
        self.check(name, version)
        meta = oip.ModelMetadataResponse(name=self.name, versions=[self.version], platform=PLATFORM)
        for tensor, (datatype, shape) in self._inputs().items():
            meta.inputs.add(name=tensor, datatype=datatype, shape=shape)
        for tensor, (datatype, shape) in self._outputs().items():
            meta.outputs.add(name=tensor, datatype=datatype, shape=shape)
        return meta

    def config(self, name: str, version: str = "") -> oip.ModelConfigResponse:
        self.check(name, version)
        config = oip.ModelConfig(
            name=self.name, platform=PLATFORM, backend="onnxruntime", max_batch_size=0
        )
        for tensor, (datatype, shape) in self._inputs().items():
            optional = tensor != "input_ids"
            config.input.add(
                name=tensor, data_type=_CONFIG_TYPES[datatype], dims=shape, optional=optional
            )
        for tensor, (datatype, shape) in self._outputs().items():
            config.output.add(name=tensor, data_type=_CONFIG_TYPES[datatype], dims=shape)
        return oip.ModelConfigResponse(config=config)

    def statistics(self, name: str = "", version: str = "") -> oip.ModelStatisticsResponse:
        if name:
            self.check(name, version)
        s = self.stats
        stats = oip.ModelStatistics(
            name=self.name,
            version=self.version,
            last_inference=s.last_ms,
            inference_count=s.sequences,
            execution_count=s.success,
        )
        inference = stats.inference_stats
        inference.success.count, inference.success.ns = s.success, s.success_ns
        inference.fail.count, inference.fail.ns = s.fail, s.fail_ns
        inference.queue.count, inference.queue.ns = s.success, s.queue_ns
        inference.compute_input.count, inference.compute_input.ns = s.success, s.input_ns
        inference.compute_infer.count, inference.compute_infer.ns = s.success, s.infer_ns
        inference.compute_output.count, inference.compute_output.ns = s.success, s.output_ns
        return oip.ModelStatisticsResponse(model_stats=[stats])

    async def infer(
        self, request: oip.ModelInferRequest, timeout: float | None
    ) -> oip.ModelInferResponse:
        """Run one request through the data plane; counts it either way. Each output is
        written once, from the data plane's arrays, into the answer or into the client's
        shared-memory region."""
        start = time.perf_counter_ns()
        try:
            self.check(request.model_name, request.model_version)
            plan = to_encode_request(request)
            translated = time.perf_counter_ns()
            async with self.dataplane.results(plan.encode, timeout) as (encode_plan, results):
                answering = time.perf_counter_ns()
                response = self._answer(request, plan.outputs, encode_plan, results)
                answered = time.perf_counter_ns()
        except BaseException:
            self.stats.fail += 1
            self.stats.fail_ns += time.perf_counter_ns() - start
            raise
        s = self.stats
        s.success += 1
        s.success_ns += time.perf_counter_ns() - start
        s.input_ns += translated - start
        s.output_ns += answered - answering
        s.queue_ns += response.parameters["queue_ns"].int64_param
        s.infer_ns += response.parameters["inference_ns"].int64_param
        s.sequences += len(results)
        s.last_ms = time.time_ns() // 1_000_000
        return response

    def _answer(self, request, outputs: list[str], plan, results) -> oip.ModelInferResponse:
        response = oip.ModelInferResponse(
            model_name=self.name, model_version=self.version, id=request.id
        )
        requested = {o.name: o.parameters for o in request.outputs}
        for i, name in enumerate(outputs):
            rows = output_rows(name, plan, results)
            shape, dtype = stacked_shape(rows), rows[0].dtype
            out = response.outputs.add(name=name, datatype=datatype_of(rows[0]), shape=shape)
            params = requested.get(name, {})
            if SHM_REGION in params:  # written into the client's region; nothing on the wire
                stack_into(self._shared_array(params, shape, dtype, f"outputs[{i}]"), rows, name)
                for key in (SHM_REGION, SHM_OFFSET, SHM_SIZE):
                    if key in params:
                        out.parameters[key].CopyFrom(params[key])
                response.raw_output_contents.append(b"")  # keeps the outputs' order
                continue
            array = np.empty(shape, dtype)
            stack_into(array, rows, name)
            response.raw_output_contents.append(array.tobytes())
        response.parameters["queue_ns"].int64_param = max(r.queue_ns for r in results)
        response.parameters["inference_ns"].int64_param = max(r.inference_ns for r in results)
        return response

    def _shared_array(self, params, shape, dtype, field: str) -> np.ndarray:
        """The part of a registered region an output goes to, as a writable array."""
        field = f"{field}.parameters"
        region = self.shared_memory.get(params[SHM_REGION].string_param, f"{field}.{SHM_REGION}")
        size = _int_parameter(params, SHM_SIZE, region.byte_size, field)
        offset = _int_parameter(params, SHM_OFFSET, 0, field)
        return region.array(offset, size, shape, np.dtype(dtype), field)

    def _inputs(self) -> dict[str, tuple[str, list[int]]]:
        shapes = {"input_ids": [-1, -1], "input_lengths": [-1], "text": [-1]}
        return {name: (datatype, shapes[name]) for name, (datatype, _) in INPUTS.items()}

    def _outputs(self) -> dict[str, tuple[str, list[int]]]:
        d = self.dataplane.backend.config.d_model
        shapes = {
            "embeddings": [-1, -1, d],
            "pooled": [-1, d],
            "token_ids": [-1, -1],
            "lengths": [-1],
            "attention": [-1, -1, -1, -1, -1],
            "attention_indices": [-1, -1, -1, -1, -1],
            "head_entropy": [-1, -1, -1],
        }
        return {name: (OUTPUT_DATATYPES[name], shapes[name]) for name in OUTPUT_DATATYPES}


def _int_parameter(params, key: str, default: int, field: str) -> int:
    if key not in params:
        return default
    which = params[key].WhichOneof("parameter_choice")
    if which not in ("int64_param", "uint64_param"):
        raise InvalidInputError(f"{field}.{key}: must be an integer")
    return int(getattr(params[key], which))


class InferenceServicer(oip_grpc.GRPCInferenceServiceServicer):
    """The protocol's gRPC service over a V2Model; errors map through the status table."""

    def __init__(self, model: V2Model) -> None:
        self.model = model

    async def ServerLive(self, request, context) -> oip.ServerLiveResponse:
        return oip.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context) -> oip.ServerReadyResponse:
        return oip.ServerReadyResponse(ready=self.model.ready)

    async def ModelReady(self, request, context) -> oip.ModelReadyResponse:
        try:
            self.model.check(request.name, request.version)
        except ModelNotFoundError:
            return oip.ModelReadyResponse(ready=False)
        return oip.ModelReadyResponse(ready=self.model.ready)

    async def ServerMetadata(self, request, context) -> oip.ServerMetadataResponse:
        return self.model.server_metadata()

    async def ModelMetadata(self, request, context) -> oip.ModelMetadataResponse:
        return await self._call(context, self.model.metadata, request.name, request.version)

    async def ModelConfig(self, request, context) -> oip.ModelConfigResponse:
        return await self._call(context, self.model.config, request.name, request.version)

    async def ModelStatistics(self, request, context) -> oip.ModelStatisticsResponse:
        return await self._call(context, self.model.statistics, request.name, request.version)

    async def SystemSharedMemoryRegister(self, request, context):
        await self._call(
            context,
            self.model.shared_memory.register,
            request.name,
            request.key,
            request.offset,
            request.byte_size,
        )
        return oip.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request, context):
        await self._call(context, self.model.shared_memory.unregister, request.name)
        return oip.SystemSharedMemoryUnregisterResponse()

    async def SystemSharedMemoryStatus(self, request, context):
        regions = await self._call(context, self.model.shared_memory.status, request.name)
        response = oip.SystemSharedMemoryStatusResponse()
        for r in regions:
            status = response.regions[r.name]
            status.name, status.key, status.offset, status.byte_size = (
                r.name,
                r.key,
                r.offset,
                r.byte_size,
            )
        return response

    async def ModelInfer(
        self, request: oip.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> oip.ModelInferResponse:
        try:
            with self.model.dataplane.observed("ModelInfer"):
                return await self.model.infer(request, context.time_remaining())
        except Exception as exc:
            await context.abort(status_for(exc), str(exc) or type(exc).__name__)

    async def _call(self, context, method, *args):
        """method(*args), or the call aborted with the status of what it raised."""
        try:
            return method(*args)
        except AttnserveError as exc:
            await context.abort(status_for(exc), str(exc))
