"""System shared memory: regions are checked when registered and when written, refusals are
INVALID_ARGUMENT naming the field, and forgetting a region never pulls it from under a
request. Real POSIX objects, the real in-process server."""

from __future__ import annotations

import mmap
import os

import grpc
import numpy as np
import pytest

from attnserve.oip import grpc_service_pb2 as oip
from attnserve.oip import grpc_service_pb2_grpc as oip_grpc
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.oip.shared_memory import SharedMemoryRegistry
from tests.conftest import SMALL_CONFIG


@pytest.fixture
def shm_object(tmp_path):
    """A 4 KiB object, as a client would make under /dev/shm."""
    path = tmp_path / "region"
    path.write_bytes(bytes(4096))
    return path


def test_a_region_must_exist_belong_to_the_server_and_fit_its_object(tmp_path, shm_object):
    registry = SharedMemoryRegistry(tmp_path)
    with pytest.raises(InvalidInputError, match="key: cannot open"):
        registry.register("a", "/missing", 0, 16)
    with pytest.raises(InvalidInputError, match="offset, byte_size"):
        registry.register("a", "/region", 4000, 200)
    registry.register("a", "/region", 0, 4096)
    with pytest.raises(InvalidInputError, match="already registered"):
        registry.register("a", "/region", 0, 16)
    if os.getuid() == 0:  # only root can hand the object to another user
        os.chown(shm_object, 65534, 65534)
        with pytest.raises(InvalidInputError, match="belongs to another user"):
            registry.register("b", "/region", 0, 16)


def test_an_output_is_checked_against_its_part_of_the_region(tmp_path, shm_object):
    registry = SharedMemoryRegistry(tmp_path)
    registry.register("a", "/region", 1024, 1024)
    region = registry.get("a", "field")
    with pytest.raises(InvalidInputError, match="shared_memory_byte_size"):
        region.array(0, 64, (32,), np.dtype("<f4"), "field")  # 128 bytes asked, 64 given
    with pytest.raises(InvalidInputError, match="do not fit region"):
        region.array(1000, 128, (32,), np.dtype("<f4"), "field")
    region.array(0, 128, (32,), np.dtype("<f4"), "field")[:] = 1.5
    with shm_object.open("rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert np.frombuffer(m, "<f4", 32, offset=1024).tolist() == [1.5] * 32


def test_unregistering_a_region_in_use_is_safe(tmp_path, shm_object):
    registry = SharedMemoryRegistry(tmp_path)
    registry.register("a", "/region", 0, 4096)
    held = registry.get("a", "field")  # a request that is about to write
    registry.unregister("a")
    held.array(0, 4096, (1024,), np.dtype("<f4"), "field")[:] = 2.0  # its mapping still works
    with pytest.raises(InvalidInputError, match="no shared-memory region 'a'"):
        registry.get("a", "outputs[0].parameters.shared_memory_region")
    with pytest.raises(InvalidInputError, match="name: no region"):
        registry.unregister("a")


def _infer(stub, region: str, byte_size: int) -> oip.ModelInferResponse:
    request = oip.ModelInferRequest(model_name=SMALL_CONFIG.name)
    ids = np.array([[1, 2, 3, 4]], dtype="<i8")
    request.inputs.add(name="input_ids", datatype="INT64", shape=ids.shape)
    request.raw_input_contents.append(ids.tobytes())
    out = request.outputs.add(name="attention")
    out.parameters["shared_memory_region"].string_param = region
    out.parameters["shared_memory_byte_size"].int64_param = byte_size
    return stub.ModelInfer(request, timeout=60)


def test_bad_regions_are_refused_and_the_server_answers_as_before(server):
    key = f"attnserve-test-{os.getpid()}"
    fd = os.open(f"/dev/shm/{key}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 1 << 16)
    channel = grpc.insecure_channel(server.address)
    stub = oip_grpc.GRPCInferenceServiceStub(channel)
    register = oip.SystemSharedMemoryRegisterRequest
    try:
        with pytest.raises(grpc.RpcError) as refused:
            stub.SystemSharedMemoryRegister(register(name="r", key="/nope", byte_size=64))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "key" in refused.value.details()
        stub.SystemSharedMemoryRegister(register(name="r", key=f"/{key}", byte_size=1 << 16))
        size = SMALL_CONFIG.n_layers * SMALL_CONFIG.n_heads * 4 * 4 * 4
        first = _infer(stub, "r", size)
        before = os.pread(fd, size, 0)
        for region, byte_size, field in (
            ("r", size - 4, "shared_memory_byte_size"),
            ("other", size, "shared_memory_region"),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                _infer(stub, region, byte_size)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert field in refused.value.details()
        again = _infer(stub, "r", size)
        assert os.pread(fd, size, 0) == before  # the refusals wrote nothing; the same numbers
        assert list(again.outputs[0].shape) == list(first.outputs[0].shape)
    finally:
        stub.SystemSharedMemoryUnregister(oip.SystemSharedMemoryUnregisterRequest(name="r"))
        channel.close()
        os.close(fd)
        os.unlink(f"/dev/shm/{key}")
