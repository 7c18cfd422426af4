"""The Open Inference Protocol, transport-free: what /v2 over HTTP and
inference.GRPCInferenceService over gRPC both call (service/http/oip.py, service/grpc/oip.py).

`OipProtocol` is the protocol's view of the server (its metadata, the repository extension,
the shared-memory regions, statistics per model version); `OipModel` that of one served
model version. Requests and answers are Python values (service/oip/messages.py);
metadata, config, statistics and the index are the protocol's JSON documents, which the
gRPC transport parses into its messages. A request runs through its model's data plane, as
Encode does (service/oip/tensors.py translates it), so its requests, attnserve.v1's and HTTP's
requests batch together. Inputs and outputs may sit in a client's shared-memory region.
Errors are the service's typed ones.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata

import numpy as np

from attnserve.oip.wire import BYTES, Parameter, from_bytes, unpack_bytes
from attnserve.service.core.dataplane import DataPlane
from attnserve.service.core.errors import InvalidInputError, UnsupportedError
from attnserve.service.core.repository import ModelRepository
from attnserve.service.oip.messages import (
    SHM_PARAMETERS,
    InferRequest,
    InferResponse,
    InputTensor,
    OutputTensor,
    RequestedOutput,
    wire_errors,
)
from attnserve.service.oip.outputs import (
    OUTPUT_DATATYPES,
    output_rows,
    stack_into,
    stacked_shape,
)
from attnserve.service.oip.parameters import parameter_names
from attnserve.service.oip.shared_memory import SharedMemoryRegistry
from attnserve.service.oip.tensors import INPUTS, check_input, translate

PLATFORM = "onnxruntime_onnx"
# What the server implements of Triton's extensions, as ServerMetadata lists them.
EXTENSIONS = [
    "model_configuration",
    "model_repository",
    "statistics",
    "system_shared_memory",
    "binary_tensor_data",
]
# The repository extension's parameters of a load and of an unload, and their types.
LOAD_PARAMETERS: dict[str, type] = {}  # Triton's "config" would replace the model's own
UNLOAD_PARAMETERS: dict[str, type] = {"unload_dependents": bool}  # no model has dependents
CONFIG_TYPES = {"INT64": "TYPE_INT64", "INT32": "TYPE_INT32", "FP32": "TYPE_FP32"}
CONFIG_TYPES |= {"FP16": "TYPE_FP16", BYTES: "TYPE_STRING"}


@dataclass
class _Statistics:
    """Counts and durations of ModelInfer calls (Triton's statistics extension)."""

    success: int = 0
    success_ns: int = 0
    fail: int = 0
    fail_ns: int = 0
    queue_ns: int = 0
    input_ns: int = 0  # reading the inputs and translating them for the data plane
    infer_ns: int = 0
    output_ns: int = 0  # writing the outputs (into the answer or shared memory)
    sequences: int = 0
    last_ms: int = 0


class OipProtocol:
    """The protocol's calls over every served model (by name and version): health,
    metadata, inference, the repository and shared-memory extensions; no transport."""

    def __init__(
        self,
        repository: ModelRepository,
        shared_memory: SharedMemoryRegistry,
        repository_api: bool = True,
    ) -> None:
        """`repository_api` False: no load or unload (Ray Serve: a call would reach one
        replica of many); what is not served is not advertised."""
        self.repository = repository
        self.shared_memory = shared_memory
        self.repository_api = repository_api
        self._stats: dict[tuple[str, str], _Statistics] = {}
        self.extensions = [
            e
            for e in EXTENSIONS
            if (e != "model_repository" or repository_api)
            and (e != "system_shared_memory" or shared_memory.served)
        ]

    @property
    def ready(self) -> bool:
        return self.repository.ready

    def server_metadata(self) -> dict:
        version = metadata.version("attnserve")
        return {"name": "attnserve", "version": version, "extensions": self.extensions}

    def _model(self, dataplane: DataPlane) -> OipModel:
        stats = self._stats.setdefault((dataplane.name, dataplane.version), _Statistics())
        return OipModel(dataplane, self.shared_memory, stats)

    def statistics(self, model: OipModel | None = None) -> dict:
        """One model's statistics, or (None) every served model's."""
        served = [model] if model else [self._model(d) for d in self.repository.served.values()]
        return {"model_stats": [m.statistics() for m in served]}

    @contextlib.contextmanager
    def observed(self, method: str) -> Iterator[Callable[[str, str], OipModel]]:
        """Count and time one call of `method` that names a model (the repository's
        `observed`, as every transport's model calls are), translation errors included;
        yields `find(name, version)`: the served model `name` at `version` ("": the one
        served), or ModelNotFoundError."""
        with self.repository.observed(method) as find:
            yield lambda name, version: self._model(find(name, version))

    def index(self, ready_only: bool = False) -> list[dict]:
        """Triton's repository index: every model, loaded or not."""
        self._check_repository_api()
        return [
            {"name": s.name, "version": s.version, "state": s.state, "reason": s.reason}
            for s in self.repository.index(ready_only)
        ]

    def _check_repository_api(self) -> None:
        if not self.repository_api:
            raise UnsupportedError(
                "the model repository extension is not served here: a load or unload would "
                "reach one replica of many; deploy a new version of the application instead"
            )

    async def load(self, name: str, parameters: dict[str, Parameter]) -> None:
        self._check_repository_api()
        _check_parameters(parameters, LOAD_PARAMETERS)
        await self.repository.load(name)

    async def unload(self, name: str, parameters: dict[str, Parameter]) -> None:
        self._check_repository_api()
        _check_parameters(parameters, UNLOAD_PARAMETERS)
        await self.repository.unload(name)


def _check_parameters(parameters: dict[str, Parameter], known: dict[str, type]) -> None:
    for key, value in parameters.items():
        kind = known.get(key)
        if kind is None:
            raise InvalidInputError(
                f"parameters.{key}: not taken here (known: {', '.join(known) or 'none'}); "
                "a model loads what its directory holds"
            )
        if not isinstance(value, kind):
            raise InvalidInputError(f"parameters.{key}: must be a {kind.__name__}, got {value!r}")


class OipModel:
    """One served model version as the protocol sees it."""

    def __init__(
        self, dataplane: DataPlane, shared_memory: SharedMemoryRegistry, stats: _Statistics
    ) -> None:
        self.dataplane = dataplane
        self.shared_memory = shared_memory
        self.stats = stats

    @property
    def name(self) -> str:
        return self.dataplane.name

    @property
    def version(self) -> str:
        """The repository's version folder ("1" with --model): Triton's tools (perf_analyzer)
        read versions as integers. The weights' hash, attnserve.v1's model_version, names
        the same version too."""
        return self.dataplane.version

    @property
    def ready(self) -> bool:
        return self.dataplane.refusal is None

    def metadata(self) -> dict:
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": PLATFORM,
            "inputs": [
                {"name": n, "datatype": d, "shape": s} for n, (d, s) in self._inputs().items()
            ],
            "outputs": [
                {"name": n, "datatype": d, "shape": s} for n, (d, s) in self._outputs().items()
            ],
        }

    def config(self) -> dict:
        # No input is marked optional, though text and input_ids are alternatives and
        # input_lengths has a default: perf_analyzer's shared-memory mode refuses a model
        # with optional inputs, and sends every input instead (tensors.py reads an all-empty
        # text beside input_ids as no text).
        inputs = [
            {"name": n, "data_type": CONFIG_TYPES[d], "dims": s}
            for n, (d, s) in self._inputs().items()
        ]
        outputs = [
            {"name": n, "data_type": CONFIG_TYPES[d], "dims": s}
            for n, (d, s) in self._outputs().items()
        ]
        config = {"name": self.name, "platform": PLATFORM, "backend": "onnxruntime"}
        return {"config": config | {"max_batch_size": 0, "input": inputs, "output": outputs}}

    def statistics(self) -> dict:
        s = self.stats
        ns = {
            "success": (s.success, s.success_ns),
            "fail": (s.fail, s.fail_ns),
            "queue": (s.success, s.queue_ns),
            "compute_input": (s.success, s.input_ns),
            "compute_infer": (s.success, s.infer_ns),
            "compute_output": (s.success, s.output_ns),
        }
        stats = {
            "name": self.name,
            "version": self.version,
            "last_inference": s.last_ms,
            "inference_count": s.sequences,
            "execution_count": s.success,
            "inference_stats": {k: {"count": c, "ns": t} for k, (c, t) in ns.items()},
        }
        return stats

    async def infer(self, request: InferRequest, timeout: float | None) -> InferResponse:
        """Run one request through the data plane; counts it either way. Each output is
        written once, from the data plane's arrays, into the answer or into the client's
        shared-memory region."""
        start = time.perf_counter_ns()
        try:
            for i, tensor in enumerate(request.inputs):
                self._read_input(i, tensor)
            plan = translate(request, self.dataplane.view.config)
            translated = time.perf_counter_ns()
            run = self.dataplane.results(plan.inputs, plan.options, timeout)
            # the plan's errors name the parameters this client sent, not attnserve.v1's fields
            with parameter_names():
                async with run as (encode_plan, results):
                    answering = time.perf_counter_ns()
                    requested = {o.name: o for o in request.outputs}
                    outputs = [
                        self._output(i, name, requested.get(name), encode_plan, results)
                        for i, name in enumerate(plan.outputs)
                    ]
                    answered = time.perf_counter_ns()
        except BaseException:
            self.stats.fail += 1
            self.stats.fail_ns += time.perf_counter_ns() - start
            raise
        queue_ns = max(r.queue_ns for r in results)
        inference_ns = max(r.inference_ns for r in results)
        s = self.stats
        s.success += 1
        s.success_ns += time.perf_counter_ns() - start
        s.input_ns += translated - start
        s.output_ns += answered - answering
        s.queue_ns += queue_ns
        s.infer_ns += inference_ns
        s.sequences += len(results)
        s.last_ms = time.time_ns() // 1_000_000
        parameters: dict[str, Parameter] = {"queue_ns": queue_ns, "inference_ns": inference_ns}
        warnings = [
            f"row {row}: {r.readouts.patching.warning}"
            for row, r in enumerate(results)
            if r.readouts and r.readouts.patching and r.readouts.patching.warning
        ]
        if warnings:
            parameters["patching_warning"] = "; ".join(warnings)
        return InferResponse(self.name, self.version, request.id, parameters, outputs)

    def _read_input(self, index: int, tensor: InputTensor) -> None:
        """Fill in an input placed in shared memory. Triton's extension: when the shared-memory
        parameters are set for an input, its data "must not be set"."""
        if not tensor.in_shared_memory:
            if tensor.data is None:
                raise InvalidInputError(
                    f"inputs[{index}].data: required (or the shared-memory parameters)"
                )
            return
        field = f"inputs[{index}]"
        if tensor.data is not None:
            raise InvalidInputError(
                f"{field}: an input in shared memory must not carry data or contents as well"
            )
        check_input(index, tensor)  # the model's datatype and shape, before any bytes are read
        region, offset, size = self.shared_memory.locate(tensor.parameters, field)
        data = region.read(offset, size, field)
        with wire_errors():
            tensor.data = (
                unpack_bytes(data, field)
                if tensor.datatype == BYTES
                else from_bytes(data, tensor.datatype, tensor.shape, field).copy()
            )

    def _output(
        self, index: int, name: str, requested: RequestedOutput | None, plan, results
    ) -> OutputTensor:
        rows = output_rows(name, plan, results)
        shape, dtype = stacked_shape(rows), rows[0].dtype
        datatype = "FP16" if dtype == np.float16 else OUTPUT_DATATYPES[name]
        if requested is None or not requested.in_shared_memory:
            array = np.empty(shape, dtype)
            stack_into(array, rows, name)
            return OutputTensor(name, datatype, shape, array)
        field = f"outputs[{index}]"
        region, offset, size = self.shared_memory.locate(requested.parameters, field)
        stack_into(region.array(offset, size, shape, np.dtype(dtype), field), rows, name)
        where = {k: v for k, v in requested.parameters.items() if k in SHM_PARAMETERS}
        return OutputTensor(name, datatype, shape, None, where)

    def _inputs(self) -> dict[str, tuple[str, list[int]]]:
        """The inputs metadata and config list: not head_mask, head_means or steering, which
        perf_analyzer would fill with random values (it sends every listed input;
        docs/api.md names them)."""
        shapes = {"input_ids": [-1, -1], "input_lengths": [-1], "text": [-1]}
        return {
            name: (datatype, shapes[name])
            for name, (datatype, _) in INPUTS.items()
            if name in shapes
        }

    def _outputs(self) -> dict[str, tuple[str, list[int]]]:
        """The outputs metadata and config list: not the readouts (hidden_states, logits,
        ...), which perf_analyzer would ask of every request (it asks for every listed
        output; docs/api.md names them)."""
        d = self.dataplane.view.config.embedding_dim
        shapes = {
            "embeddings": [-1, -1, d],
            "pooled": [-1, d],
            "token_ids": [-1, -1],
            "lengths": [-1],
            "attention": [-1, -1, -1, -1, -1],
            "attention_indices": [-1, -1, -1, -1, -1],
            "head_entropy": [-1, -1, -1],
        }
        return {name: (OUTPUT_DATATYPES[name], shapes[name]) for name in shapes}
