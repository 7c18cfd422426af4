"""Giving freed memory back to the operating system after a burst.

Freed buffers otherwise stay in the process: ONNX Runtime's CPU arena keeps its
chunks for the next run, and glibc keeps freed heap pages. The backend empties
its arena (service/runtime.py); this trims the C heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util


def _load_malloc_trim():
    path = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(path).malloc_trim if path else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


_MALLOC_TRIM = _load_malloc_trim()


def give_back_memory() -> bool:
    """Return the C heap's free pages to the OS (glibc's malloc_trim); False where there is
    no such call. After a burst, freed numpy and ORT buffers otherwise stay in the process."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True
