"""Graphs traced ahead in a child process (or taken back from it) are the graphs traced
here."""

import re

import onnx

from attnserve.export.model_dir import write_model_dir
from attnserve.model.artifacts import (
    EMBEDDINGS_ONNX_FILENAME,
    LENS_ONNX_FILENAME,
    ONNX_FILENAME,
)


def renumbered(graph: onnx.GraphProto) -> onnx.GraphProto:
    """`graph` with its nodes', intermediate values' and folded constants' names numbered
    in order: the exporter numbers them by a counter of its process, which may have traced
    other graphs before. The inputs, outputs and weights keep their names."""
    graph = onnx.GraphProto.FromString(graph.SerializeToString())
    weights = [v.name for v in graph.initializer if not re.fullmatch(r"val_\d+", v.name)]
    kept = {v.name for v in [*graph.input, *graph.output]} | set(weights)
    names: dict[str, str] = {}
    for index, node in enumerate(graph.node):
        node.name = f"node_{index}"
        node.ClearField("metadata_props")  # the exporter's notes on the FX node, named too
        for values in (node.input, node.output):
            for i, value in enumerate(values):
                if value and value not in kept:
                    values[i] = names.setdefault(value, f"value_{len(names)}")
    for value in [*graph.value_info, *graph.initializer]:
        value.name = names.get(value.name, value.name)
    return graph


def test_a_child_traces_the_same_graphs(small_model, tmp_path):
    dirs = {}
    for ahead in (False, True):
        dirs[ahead] = tmp_path / f"ahead-{ahead}"
        report = write_model_dir(small_model, dirs[ahead], log=lambda _: None, trace_ahead=ahead)
        assert report.parity  # checked against PyTorch, as always
    names = sorted(p.name for p in dirs[False].glob("*.onnx"))
    assert {ONNX_FILENAME, EMBEDDINGS_ONNX_FILENAME, LENS_ONNX_FILENAME} < set(names)
    assert names == sorted(p.name for p in dirs[True].glob("*.onnx"))
    for name in names:  # the child's and those this process took back from it
        here, child = (
            onnx.load(str(dirs[ahead] / name), load_external_data=False) for ahead in (False, True)
        )
        assert renumbered(child.graph) == renumbered(here.graph), name
    weights = [sorted(p.name for p in d.iterdir() if p.suffix == ".data") for d in dirs.values()]
    assert weights[0] == weights[1]
    first, second = ((d / weights[0][0]).read_bytes() for d in dirs.values())
    assert first == second
