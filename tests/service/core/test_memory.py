"""The C heap policy on the real allocator, each case in a fresh process (glibc's
thresholds move with what a process has freed before)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from attnserve.service.core.memory import _GLIBC

pytestmark = pytest.mark.skipif(_GLIBC is None, reason="not glibc")

# Allocates and frees a buffer of argv[2] MiB; reports glibc's mallinfo2 along the way.
PROBE = """
import ctypes, json, sys
import numpy as np
from attnserve.service.core.memory import _GLIBC, give_back_memory, keep_freed_heap

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split())]

_GLIBC.mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    keep_freed_heap()
buffer = np.ones(int(sys.argv[2]) * 2**17)  # float64: 2**17 of them to the MiB
mapped = _GLIBC.mallinfo2().hblkhd
del buffer
kept = _GLIBC.mallinfo2().fordblks
give_back_memory()
print(json.dumps({"mapped": mapped, "kept": kept, "after_trim": _GLIBC.mallinfo2().fordblks}))
"""


def probe(policy: str, mib: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, policy, str(mib)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


# Beyond the 32 MiB that glibc keeps on the heap by default, and beyond the 256 MiB of free
# heap top that glibc trims by itself by default (SmolLM2's 1024-token map is 283 MB).
@pytest.mark.parametrize("mib", [48, 320])
def test_the_heap_keeps_a_freed_answer_until_it_is_given_back(mib):
    default, keep = probe("default", mib), probe("keep", mib)
    size = mib * 2**20
    # glibc's default maps a fresh buffer this large and unmaps it when freed ...
    assert default["mapped"] >= size and default["kept"] < size
    # ... kept, it comes from the heap and stays there for the next answer,
    assert keep["mapped"] < size and keep["kept"] >= size
    # until the release after a burst trims it.
    assert keep["after_trim"] < size
