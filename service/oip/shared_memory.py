"""System shared memory for inputs and outputs (the protocol's extension, as Triton defines it).

A client on the same host creates a POSIX shared-memory object (/dev/shm/KEY), registers
a region of it by name, and places an input there, or asks for an output to be written
there, instead of sending it over the socket: the request or answer then carries only the
tensor's shape and where it is. Registering checks that the object exists, belongs to this
server's user and holds the region; a tensor is checked against its region's size.
Unregistering only forgets the name: a request that is using the region keeps its
mapping until it is done.
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnserve.oip.wire import Parameter
from attnserve.service.core.errors import InvalidInputError, UnsupportedError
from attnserve.service.oip.messages import SHM_OFFSET, SHM_REGION, SHM_SIZE

SHM_ROOT = Path("/dev/shm")


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    memory: mmap.mmap  # the whole object, mapped read-write

    def span(self, offset: int, size: int, field: str) -> tuple[int, int]:
        """[start, end) in the mapped object of `size` bytes at `offset` into the region."""
        if offset + size > self.byte_size:
            raise InvalidInputError(
                f"{field}: {size:,} bytes at offset {offset:,} do not fit region "
                f"{self.name!r} of {self.byte_size:,} bytes; register a larger region or ask "
                "for less (fewer layers or heads, float16, causal_packed)"
            )
        return self.offset + offset, self.offset + offset + size

    def read(self, offset: int, size: int, field: str) -> memoryview:
        """The region's bytes [offset, offset + size), without a copy."""
        start, end = self.span(offset, size, field)
        return memoryview(self.memory)[start:end]

    def array(self, offset: int, size: int, shape: tuple[int, ...], dtype: np.dtype, field: str):
        """A writable array of `shape` over the region's bytes [offset, offset + size)."""
        count = math.prod(shape)
        needed = count * dtype.itemsize
        if needed > size:
            raise InvalidInputError(
                f"{field}.{SHM_SIZE}: the output needs {needed:,} bytes, {size:,} were given"
            )
        start, _ = self.span(offset, needed, field)
        return np.frombuffer(self.memory, dtype, count, offset=start).reshape(shape)


class SharedMemoryRegistry:
    """The registered regions; `root` None: a server whose requests may reach another host
    (Ray Serve's replicas), which serves no shared memory."""

    def __init__(self, root: Path | None = SHM_ROOT) -> None:
        self.root = root
        self._regions: dict[str, Region] = {}

    @property
    def served(self) -> bool:
        return self.root is not None

    def _check_served(self) -> Path:
        if self.root is None:
            raise UnsupportedError(
                "system shared memory is not served here: a region lives on one host, and "
                "this deployment's requests may reach a replica on another"
            )
        return self.root

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        root = self._check_served()
        if not name:
            raise InvalidInputError("name: a region needs a name")
        if name in self._regions:
            raise InvalidInputError(f"name: region {name!r} is already registered")
        if not key or "/" in key.strip("/"):
            raise InvalidInputError(f"key: {key!r} is not a shared-memory object name")
        path = root / key.strip("/")
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError as exc:
            raise InvalidInputError(
                f"key: cannot open shared-memory object {key!r} ({exc.strerror})"
            ) from None
        try:
            info = os.fstat(fd)
            if info.st_uid != os.getuid():
                raise InvalidInputError(
                    f"key: shared-memory object {key!r} belongs to another user"
                )
            if byte_size < 1 or offset < 0 or offset + byte_size > info.st_size:
                raise InvalidInputError(
                    f"offset, byte_size: the region [{offset}, {offset + byte_size}) is not "
                    f"inside object {key!r} of {info.st_size} bytes"
                )
            memory = mmap.mmap(fd, info.st_size)
        finally:
            os.close(fd)
        self._regions[name] = Region(name, key, offset, byte_size, memory)

    def unregister(self, name: str = "") -> None:
        """Forget one region, or all when `name` is empty. Requests that already hold a
        region keep writing into their own mapping; it is unmapped when they let go."""
        self._check_served()
        if not name:
            self._regions.clear()
        elif self._regions.pop(name, None) is None:
            raise InvalidInputError(f"name: no region {name!r} is registered")

    def get(self, name: str, field: str) -> Region:
        self._check_served()
        region = self._regions.get(name)
        if region is None:
            raise InvalidInputError(f"{field}: no shared-memory region {name!r} is registered")
        return region

    def status(self, name: str = "") -> list[Region]:
        self._check_served()
        if name:
            return [self.get(name, "name")]
        return list(self._regions.values())

    def locate(self, parameters: dict[str, Parameter], field: str) -> tuple[Region, int, int]:
        """The region, offset and byte size a tensor's parameters name. Triton's extension:
        "The shared_memory_offset parameter is optional and defaults to zero. The other two
        parameters are required."; the region is a string, offset and size int64."""
        field = f"{field}.parameters"
        if SHM_REGION not in parameters or SHM_SIZE not in parameters:
            missing = SHM_SIZE if SHM_REGION in parameters else SHM_REGION
            raise InvalidInputError(f"{field}.{missing}: required with shared memory")
        name = parameters[SHM_REGION]
        if not isinstance(name, str):
            raise InvalidInputError(f"{field}.{SHM_REGION}: a string, got {name!r}")
        offset = _byte_count(parameters.get(SHM_OFFSET, 0), f"{field}.{SHM_OFFSET}")
        size = _byte_count(parameters[SHM_SIZE], f"{field}.{SHM_SIZE}")
        return self.get(name, f"{field}.{SHM_REGION}"), offset, size


def _byte_count(value: Parameter, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{field}: a non-negative int64, got {value!r}")
    return value
