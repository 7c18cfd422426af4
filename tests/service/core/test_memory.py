"""The C heap policy on the real allocator, each case in a fresh process (glibc's
thresholds move with what a process has freed before)."""

from __future__ import annotations

import pytest

from attnserve.service.core.memory import _GLIBC, KEEP_FREED_HEAP_ENV
from tests.conftest import run_probe

pytestmark = pytest.mark.skipif(_GLIBC is None, reason="not glibc")

# Allocates and frees a buffer of argv[2] MiB; reports glibc's mallinfo2 along the way.
# argv[1] "keep": keep_freed_heap first; anything else: the heap as the process started.
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


# Beyond the 32 MiB that glibc keeps on the heap by default, and beyond the 256 MiB of free
# heap top that glibc trims by itself by default (SmolLM2's 1024-token map is 283 MB).
@pytest.mark.parametrize("mib", [48, 320])
def test_the_heap_keeps_a_freed_answer_until_it_is_given_back(mib):
    default, keep = run_probe(PROBE, "default", str(mib)), run_probe(PROBE, "keep", str(mib))
    # The same policy for a process that only has the environment (the peers' clients).
    started_so = run_probe(PROBE, "as started", str(mib), env=KEEP_FREED_HEAP_ENV)
    size = mib * 2**20
    # glibc's default maps a fresh buffer this large and unmaps it when freed ...
    assert default["mapped"] >= size and default["kept"] < size
    for kept in (keep, started_so):
        # ... kept, it comes from the heap and stays there for the next answer,
        assert kept["mapped"] < size and kept["kept"] >= size
        # until the release after a burst trims it.
        assert kept["after_trim"] < size


# On a worker thread: two 40 MiB buffers (more than a thread's first 64 MiB sub-heap holds),
# freed, three times; argv[1] "keep": the server's policy, "thresholds only": the heap's
# thresholds (the policy without one arena), anything else: the heap as the process
# started; prints the thread's page faults per round.
WORKER_PROBE = """
import json, resource, sys, threading
import numpy as np
from attnserve.service.core.memory import _GLIBC, _M_MMAP_MAX, _M_TRIM_THRESHOLD, keep_freed_heap

if sys.argv[1] == "keep":
    keep_freed_heap()
elif sys.argv[1] == "thresholds only":
    _GLIBC.mallopt(_M_MMAP_MAX, 0)
    _GLIBC.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
faults = []

def rounds():
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        a, b = np.ones(40 * 2**20, np.uint8), np.ones(40 * 2**20, np.uint8)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
        del a, b

worker = threading.Thread(target=rounds)
worker.start()
worker.join()
print(json.dumps(faults))
"""


def test_a_worker_threads_freed_answer_stays_for_its_next_one():
    thresholds_only = run_probe(WORKER_PROBE, "thresholds only")
    keep = run_probe(WORKER_PROBE, "keep")
    started_so = run_probe(WORKER_PROBE, "as started", env=KEEP_FREED_HEAP_ENV)
    pages = 80 * 2**20 // 4096
    # The first round faults the buffers in either way (huge pages make it fewer faults) ...
    assert keep[0] > 0 and thresholds_only[0] > 0 and started_so[0] > 0
    # ... a thread's own arena unmaps the emptied sub-heap, whatever the thresholds, so every
    # round faults its pages in again; on the one shared heap the next rounds fault nothing.
    assert min(thresholds_only[1:]) > pages // 100
    assert max(keep[1:]) < pages // 100 and max(started_so[1:]) < pages // 100
