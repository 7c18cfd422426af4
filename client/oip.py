"""OipClient: the Open Inference Protocol (KServe V2) from Python, shared memory by itself.

    with OipClient("localhost:50051") as client:
        out = client.infer(input_ids=[[1, 2, 3], [4, 5]], outputs=["embeddings", "attention"])
        out["attention"]  # (2, layers, heads, 3, 3) float32, rows past a length are zeros

On the first call the client creates a POSIX shared-memory object and registers it with the
server (the protocol's system shared-memory extension); the server then writes every output
into it and the answer carries only shapes, which saves most of a large answer's time (all
attention weights at 512 tokens are 33.5 MB). Where the server cannot open the object
(another host, a container without the host's /dev/shm) the client uses the wire from then
on. The region is sized for the largest answer a request can have, and grows with the
requests; tmpfs only holds the pages the server writes.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np

from attnserve.client.client import ClientOptions, call_with_retries
from attnserve.client.errors import request_errors
from attnserve.oip import grpc_service_pb2 as oip
from attnserve.oip import grpc_service_pb2_grpc as oip_grpc
from attnserve.oip.wire import DATATYPES, from_bytes, pack_bytes, write_parameter
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1 import encoder_service_pb2_grpc as pb_grpc

SHM_ROOT = Path("/dev/shm")
ALIGN = 64  # each output starts on a cache line


class _Region:
    """A shared-memory object of this client, mapped, registered under `name`."""

    def __init__(self, root: Path, size: int) -> None:
        self.name = f"attnserve-client-{uuid.uuid4().hex}"
        self.key = f"/{self.name}"
        self.path = root / self.name
        self.size = size
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            self.memory = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def read(self, offset: int, shape: Sequence[int], datatype: str) -> np.ndarray:
        """A copy of the output at `offset`: the region is written again by the next call."""
        view = np.frombuffer(self.memory, DATATYPES[datatype], math.prod(shape), offset=offset)
        return view.reshape(shape).copy()

    def close(self) -> None:
        self.memory.close()
        self.path.unlink(missing_ok=True)


class OipClient:
    """Blocking Open Inference Protocol client of attnserve's
    `inference.GRPCInferenceService`. Not thread-safe (one region per client): give each
    thread its own."""

    def __init__(
        self,
        target: str = "localhost:50051",
        options: ClientOptions | None = None,
        shared_memory: bool = True,
        shared_memory_root: Path = SHM_ROOT,
        model: str = "",
    ) -> None:
        self.options = options or ClientOptions()
        self.channel = self.options.open_channel(target, grpc)
        self._stub = oip_grpc.GRPCInferenceServiceStub(self.channel)
        self._model = model  # a served model's name; empty: the server's default
        self._info: pb.GetModelInfoResponse | None = None
        self._shared_memory = shared_memory  # False for good once the server cannot open it
        self._root = shared_memory_root
        self._region: _Region | None = None

    @property
    def uses_shared_memory(self) -> bool:
        """Whether outputs come through a registered region (known after the first call)."""
        return self._region is not None

    def model_info(self) -> pb.GetModelInfoResponse:
        if self._info is None:
            stub = pb_grpc.EncoderServiceStub(self.channel)
            request = pb.GetModelInfoRequest(model=self._model)
            self._info = self._call(stub.GetModelInfo, request, None)
        return self._info

    def infer(
        self,
        input_ids: Sequence[Sequence[int]] | None = None,
        text: Sequence[str] | None = None,
        outputs: Sequence[str] = ("embeddings",),
        timeout: float | None = None,
        **parameters: bool | int | str | Sequence[int],
    ) -> dict[str, np.ndarray]:
        """The named outputs of a batch of token-id rows (ragged is fine) or of texts.
        `parameters` are the model's request parameters (see ModelMetadata or the README),
        e.g. attention_layers=[0], attention_dtype="FP16", top_k=4."""
        request = oip.ModelInferRequest(model_name=self.model_info().name)
        if text is not None:
            batch, seq = len(text), self.model_info().max_seq_len
            _add_text(request, text)
        elif input_ids is not None:
            batch, seq = len(input_ids), max(len(row) for row in input_ids)
            _add_ids(request, input_ids, seq)
        else:
            raise ValueError("give input_ids or text")
        for name, value in parameters.items():
            if not isinstance(value, bool | int | str):  # a list of layers, heads or rows
                value = ",".join(str(int(v)) for v in value)
            write_parameter(request.parameters[name], value, f"parameters.{name}")
        offsets = self._place(outputs, batch, seq)
        region = self._region
        for name in outputs:
            tensor = request.outputs.add(name=name)
            if offsets and region:
                params = tensor.parameters
                params["shared_memory_region"].string_param = region.name
                params["shared_memory_offset"].int64_param = offsets[name][0]
                params["shared_memory_byte_size"].int64_param = offsets[name][1]
        response = self._call(self._stub.ModelInfer, request, timeout)
        result = {}
        for i, out in enumerate(response.outputs):
            if offsets and region:
                result[out.name] = region.read(offsets[out.name][0], out.shape, out.datatype)
            else:
                raw = response.raw_output_contents[i]
                result[out.name] = from_bytes(raw, out.datatype, out.shape, out.name)
        return result

    def _place(self, outputs: Sequence[str], batch: int, seq: int) -> dict[str, tuple[int, int]]:
        """Each output's (offset, byte size) in the region, sized for the largest answer;
        empty when the outputs go over the wire."""
        if not self._shared_memory:
            return {}
        info = self.model_info()
        blocks = batch * info.n_layers * info.n_heads
        largest = {  # bytes, at most
            "embeddings": batch * seq * info.d_model * 4,
            "pooled": batch * info.d_model * 4,
            "token_ids": batch * seq * 8,
            "lengths": batch * 8,
            "attention": blocks * seq * seq * 4,
            "attention_indices": blocks * seq * seq * 4,
            "head_entropy": blocks * 4,
        }
        offsets, end = {}, 0
        for name in outputs:
            size = largest.get(name, 0)
            offsets[name] = (end, size)
            end += -(-size // ALIGN) * ALIGN
        if self._region is None or self._region.size < end:
            self._register(1 << max(end, 1).bit_length())
        return offsets if self._region is not None else {}

    def _register(self, size: int) -> None:
        self._unregister()
        try:
            region = _Region(self._root, size)
        except OSError:  # no shared memory on this host
            self._shared_memory = False
            return
        request = oip.SystemSharedMemoryRegisterRequest(
            name=region.name, key=region.key, offset=0, byte_size=size
        )
        try:
            self._call(self._stub.SystemSharedMemoryRegister, request, None)
        except grpc.RpcError as exc:
            region.close()
            if exc.code() not in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED):
                raise
            self._shared_memory = False  # the server cannot see this host's memory
            return
        self._region = region

    def _unregister(self) -> None:
        if self._region is None:
            return
        region, self._region = self._region, None
        request = oip.SystemSharedMemoryUnregisterRequest(name=region.name)
        try:
            self._call(self._stub.SystemSharedMemoryUnregister, request, None)
        finally:
            region.close()

    def _call(self, method, request, timeout: float | None):
        with request_errors():
            return call_with_retries(self.options, method, request, timeout)

    def close(self) -> None:
        with contextlib.suppress(grpc.RpcError):  # a server that is gone: unlinked anyway
            self._unregister()
        self.channel.close()

    def __enter__(self) -> OipClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _add_ids(request: oip.ModelInferRequest, rows: Sequence[Sequence[int]], seq: int) -> None:
    """Right-padded INT64 [batch, seq] with the rows' lengths beside them."""
    ids = np.zeros((len(rows), seq), dtype="<i8")
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    lengths = np.array([len(row) for row in rows], dtype="<i8")
    request.inputs.add(name="input_ids", datatype="INT64", shape=ids.shape)
    request.inputs.add(name="input_lengths", datatype="INT64", shape=lengths.shape)
    request.raw_input_contents.extend([ids.tobytes(), lengths.tobytes()])


def _add_text(request: oip.ModelInferRequest, texts: Sequence[str]) -> None:
    """BYTES [batch] of UTF-8 texts."""
    request.inputs.add(name="text", datatype="BYTES", shape=[len(texts)])
    request.raw_input_contents.append(pack_bytes(t.encode() for t in texts))
