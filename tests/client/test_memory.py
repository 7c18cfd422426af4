"""A client process that keeps its freed heap (attnserve.client.keep_freed_heap) decodes a
large answer into the pages the last one freed; each case is a fresh process, against the
shared server."""

from __future__ import annotations

import statistics

import pytest

from attnserve.service.core.memory import _GLIBC
from tests.conftest import run_probe

pytestmark = pytest.mark.skipif(_GLIBC is None, reason="not glibc")

# Twelve 300-token sequences with every attention weight in float32 from the small model
# (2 layers, 4 heads): a 35 MB answer, beyond the 32 MiB that glibc serves from its heap
# by default. argv: the server's address, "keep" or not; prints the page faults per call.
PROBE = """
import json, resource, sys
from attnserve.client import ClientOptions, EncoderClient, keep_freed_heap

if sys.argv[2] == "keep":
    keep_freed_heap()
faults = []
with EncoderClient(sys.argv[1], ClientOptions(timeout_s=60)) as client:
    for _ in range(6):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        out = client.encode([[i % 250 for i in range(300)]] * 12, attention=True)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del out
print(json.dumps(faults))
"""
ANSWER_PAGES = 12 * 2 * 4 * 300 * 300 * 4 // 4096


def test_a_client_that_keeps_its_freed_heap_decodes_into_warm_pages(server):
    default = run_probe(PROBE, server.address, "default")
    keep = run_probe(PROBE, server.address, "keep")
    # glibc's default maps the received answer afresh and unmaps it when it is freed: every
    # call faults its pages in again ...
    assert min(default) > ANSWER_PAGES
    # ... kept, the first call faults them in once and the next calls reuse them. The heap
    # may settle over the second (seen: 7,173 pages of a 18,000-page call under the full
    # suite, every later call 0 to 2): the five later calls together fault in less than one
    # call does without it.
    assert keep[0] > ANSWER_PAGES
    assert sum(keep[1:]) < min(default)
    assert statistics.median(keep[2:]) < ANSWER_PAGES // 10
