"""Graphs past protobuf's 2 GB limit: weights as ONNX external data beside each graph.

No test can afford a 2 GB model, so the threshold is lowered: the small model's graphs
then take the same path a 0.5B-parameter model's take (benchmarks/families.py measures
that one for real).
"""

import numpy as np
import onnx
from onnx.external_data_helper import uses_external_data

from attnserve.export import onnx_files
from attnserve.export.model_dir import GRAPHS, write_model_dir
from attnserve.service.ort.runtime import OrtRuntime, RuntimeOptions, weights_version


def test_graphs_past_the_threshold_keep_their_weights_beside_them(
    small_model, small_runtime, tmp_path, monkeypatch
):
    monkeypatch.setattr(onnx_files, "EXTERNAL_DATA_BYTES", 1024)
    out = tmp_path / "external"
    write_model_dir(small_model, out, log=lambda _: None)
    for name in GRAPHS:
        graph, data = out / name, out / f"{name}.data"
        assert data.stat().st_size > graph.stat().st_size  # the weights left the graph
        proto = onnx.load(str(graph), load_external_data=False)
        large = [t for t in proto.graph.initializer if np.prod(t.dims) * 2 > 1024]
        assert large and all(uses_external_data(t) for t in large)
    runtime = OrtRuntime(out, RuntimeOptions(provider="cpu"))
    ids = np.random.default_rng(0).integers(0, 259, size=(2, 33))
    for got, want in zip(runtime.run(ids), small_runtime.run(ids), strict=True):
        assert np.abs(got - want).max() <= 1e-5
    assert np.abs(runtime.embed(ids) - small_runtime.embed(ids)).max() <= 1e-5


def test_the_version_covers_external_weights(tmp_path):
    graph = tmp_path / "model.onnx"
    graph.write_bytes(b"graph")
    (tmp_path / "model.onnx.data").write_bytes(b"weights one")
    first = weights_version(graph)
    (tmp_path / "model.onnx.data").write_bytes(b"weights two")
    assert weights_version(graph) != first
