"""Graphs traced ahead in a child process are the graphs traced here."""

import onnx

from attnserve.export.model_dir import write_model_dir
from attnserve.model.artifacts import (
    EMBEDDINGS_ONNX_FILENAME,
    LENS_ONNX_FILENAME,
    ONNX_FILENAME,
)


def test_a_child_traces_the_same_graphs(small_model, tmp_path):
    dirs = {}
    for ahead in (False, True):
        dirs[ahead] = tmp_path / f"ahead-{ahead}"
        report = write_model_dir(small_model, dirs[ahead], log=lambda _: None, trace_ahead=ahead)
        assert report.parity  # checked against PyTorch, as always
    for name in (ONNX_FILENAME, EMBEDDINGS_ONNX_FILENAME, LENS_ONNX_FILENAME):
        here, child = (
            onnx.load(str(dirs[ahead] / name), load_external_data=False) for ahead in (False, True)
        )
        for graph in (here.graph, child.graph):  # numbered by the exporter's process
            for node in graph.node:
                node.name = ""
        assert child.graph == here.graph, name  # nodes, initializers and their file offsets
    weights = [sorted(p.name for p in d.iterdir() if p.suffix == ".data") for d in dirs.values()]
    assert weights[0] == weights[1]
    first, second = ((d / weights[0][0]).read_bytes() for d in dirs.values())
    assert first == second
