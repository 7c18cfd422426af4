"""System shared memory for outputs (the protocol's extension, as Triton defines it).

A client on the same host creates a POSIX shared-memory object (/dev/shm/KEY), registers
a region of it by name, and asks for an output to be written there instead of sent over
the socket: the answer then carries only the tensor's shape. Registering checks that the
object exists, belongs to this server's user and holds the region; a request's output is
checked against its region's size. Unregistering only forgets the name: a request that
is writing into the region keeps its mapping until it is done.
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnserve.service.core.errors import InvalidInputError

SHM_ROOT = Path("/dev/shm")


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    memory: mmap.mmap  # the whole object, mapped read-write

    def array(
        self, offset: int, size: int, shape: tuple[int, ...], dtype: np.dtype, field: str
    ) -> np.ndarray:
        """A writable array of `shape` over the region's bytes [offset, offset + size)."""
        needed = math.prod(shape) * dtype.itemsize
        if needed > size:
            raise InvalidInputError(
                f"{field}.shared_memory_byte_size: the output needs {needed:,} bytes, "
                f"{size:,} were given"
            )
        if offset < 0 or offset + needed > self.byte_size:
            raise InvalidInputError(
                f"{field}: {needed:,} bytes at offset {offset:,} do not fit region "
                f"{self.name!r} of {self.byte_size:,} bytes; register a larger region or ask "
                "for less (fewer layers or heads, float16, causal_packed)"
            )
        count = math.prod(shape)
        view = np.frombuffer(self.memory, dtype, count, offset=self.offset + offset)
        return view.reshape(shape)


class SharedMemoryRegistry:
    def __init__(self, root: Path = SHM_ROOT) -> None:
        self.root = root
        self._regions: dict[str, Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidInputError("name: a region needs a name")
        if name in self._regions:
            raise InvalidInputError(f"name: region {name!r} is already registered")
        if not key or "/" in key.strip("/"):
            raise InvalidInputError(f"key: {key!r} is not a shared-memory object name")
        path = self.root / key.strip("/")
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
        if not name:
            self._regions.clear()
        elif self._regions.pop(name, None) is None:
            raise InvalidInputError(f"name: no region {name!r} is registered")

    def get(self, name: str, field: str) -> Region:
        region = self._regions.get(name)
        if region is None:
            raise InvalidInputError(f"{field}: no shared-memory region {name!r} is registered")
        return region

    def status(self, name: str = "") -> list[Region]:
        if name:
            return [self.get(name, "name")]
        return list(self._regions.values())
