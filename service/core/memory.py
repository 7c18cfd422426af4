"""The C heap between requests, and giving freed memory back after a burst.

Between requests the heap should keep what an answer freed for the next one:
glibc by default maps each large buffer fresh and trims the heap as soon as its
free top is twice the last such buffer, so every copy of an 8 MB answer faults
its pages in again (4 ms instead of 1.3; 30 ms instead of 3.8 to copy a 32 MiB attention
map into its answer). Any bound on the free heap kept has the same effect on answers
beyond it: kept up to 256 MiB, SmolLM2-135M's 1024-token map faulted 3.5 GB afresh on
every call (898,000 faults: 3 s of a 7 s call on this virtual machine; 700 faults and
3.7 s with all of it kept). After a burst, freed buffers should go back to the OS: ONNX
Runtime's CPU arena keeps its chunks for the next run (the backend empties it,
service/ort/runtime.py) and glibc its heap pages (trimmed here).
"""

from __future__ import annotations

import ctypes
import ctypes.util

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8
# The policy: each mallopt parameter, the tunable that sets it from the environment, its value.
_KEPT = (
    (_M_MMAP_MAX, "MALLOC_MMAP_MAX_", 0),  # no buffer mapped on its own
    (_M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", 2**31 - 1),  # the largest: never by itself
    (_M_ARENA_MAX, "MALLOC_ARENA_MAX", 1),  # one heap for every thread
)
# keep_freed_heap's policy for a process started with this environment, one that does not
# run attnserve: the peers benchmark's other clients and its echo server.
KEEP_FREED_HEAP_ENV = {name: str(value) for _, name, value in _KEPT}


def _load_glibc() -> ctypes.CDLL | None:
    path = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(path) if path else None
        return libc if libc and libc.malloc_trim and libc.mallopt else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune or trim
        return None


_GLIBC = _load_glibc()


def keep_freed_heap() -> bool:
    """Serve every buffer from the heap (no mapping of its own, however large: glibc maps
    no more than 32 MiB from the heap otherwise) and keep all of the freed heap for the
    next request: give_back_memory returns it after a burst, pages in the middle of the
    heap included; False where this is not glibc.

    Every thread shares the one heap: a worker thread's own arena grows in 64 MiB
    sub-heaps, and one that empties is unmapped whatever the trim threshold, so an answer
    built on a worker thread and freed after it was sent faulted its pages in afresh on
    the next call (a float16 causal-packed 512-token map: 4-6 ms of a 45 ms call). Call
    it before the server's threads start: a thread keeps the arena it first used."""
    if _GLIBC is None:
        return False
    return all(_GLIBC.mallopt(parameter, value) for parameter, _, value in _KEPT)


def give_back_memory() -> bool:
    """Return the C heap's free pages to the OS (glibc's malloc_trim); False where there is
    no such call. After a burst, freed numpy and ORT buffers otherwise stay in the process."""
    if _GLIBC is None:
        return False
    _GLIBC.malloc_trim(0)
    return True
