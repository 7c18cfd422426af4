"""attnserve and tritonclient in one process, imported in either order: attnserve's V2
messages live in a descriptor pool of their own (protos/generate.py), so neither
definition of `inference.*` collides with the other, and both clients call one live
server and get the same numbers. Each order runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

IMPORTS = {
    "attnserve client first": ["attnserve.client.oip", "tritonclient.grpc"],
    "tritonclient first": ["tritonclient.grpc", "attnserve.client.oip"],
    "attnserve server first": ["attnserve.service.server", "tritonclient.grpc"],
    "tritonclient before the server": ["tritonclient.grpc", "attnserve.service.server"],
}
CALLS = """
import numpy as np
import tritonclient.grpc as triton
from attnserve.client.oip import OipClient

ids = np.array([[3, 1, 4, 1, 5]], dtype=np.int64)
with OipClient(ADDRESS, shared_memory=False) as ours:
    name = ours.model_info().name
    mine = ours.infer(input_ids=ids.tolist(), outputs=["embeddings"])["embeddings"]
theirs = triton.InferenceServerClient(ADDRESS)
tensor = triton.InferInput("input_ids", list(ids.shape), "INT64")
tensor.set_data_from_numpy(ids)
answer = theirs.infer(name, [tensor], outputs=[triton.InferRequestedOutput("embeddings")])
np.testing.assert_array_equal(answer.as_numpy("embeddings"), mine)
print("same", mine.shape)
"""


@pytest.mark.parametrize("order", IMPORTS)
def test_both_clients_import_and_call_one_server(server, order):
    code = "".join(f"import {module}\n" for module in IMPORTS[order])
    code += f"ADDRESS = {server.address!r}\n" + CALLS
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    d_model = server.running.backend.config.d_model
    assert result.stdout.strip() == f"same (1, 5, {d_model})"
