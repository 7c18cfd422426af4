"""Tracing a model's other graphs in a child process while this one traces the first.

Tracing is single-threaded Python: about a minute per graph for a 1B model, and an import
traces two or three. The graphs depend on the config alone (they are traced on the meta
device), so with a second core a child process traces every graph but the first while this
one traces the first and writes the weights; it hands each back as ONNX bytes, its
initializers placeholders that export_onnx replaces by the real tensors.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor

import onnx
import onnx_ir as ir

from attnserve.export.onnx_export import trace
from attnserve.model.config import ModelConfig

# Below this depth tracing takes seconds, less than starting a child process that imports
# torch: small models trace here.
AHEAD_MIN_LAYERS = 12


@contextlib.contextmanager
def tracer(
    config: ModelConfig, kinds: Sequence[str], ahead: bool | None = None
) -> Iterator[Callable[[str], ir.Model]]:
    """A function kind -> its traced graph. `ahead` (None: for deep models on two cores or
    more): the kinds after the first are traced in a child process, in order, from now."""
    if ahead is None:
        ahead = config.n_layers >= AHEAD_MIN_LAYERS and len(os.sched_getaffinity(0)) > 1
    if not ahead or len(kinds) < 2:
        yield lambda kind: trace(config, kind)
        return
    context = multiprocessing.get_context("spawn")  # no fork of a process running torch
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        pending = {kind: pool.submit(traced_bytes, config.to_json(), kind) for kind in kinds[1:]}

        def get(kind: str) -> ir.Model:
            if kind not in pending:
                return trace(config, kind)
            proto = onnx.ModelProto.FromString(pending[kind].result())
            return ir.serde.deserialize_model(proto)

        yield get


def traced_bytes(config_json: str, kind: str) -> bytes:
    """In the child: the graph of `kind` as ONNX bytes, each initializer a placeholder of
    its shape and type (the weights are the parent's)."""
    model = trace(ModelConfig.from_json(config_json), kind)
    for value in model.graph.initializers.values():
        assert value.dtype and value.shape and value.name  # traced: all known
        size = math.prod(value.shape.numpy()) * value.dtype.itemsize
        value.const_value = ir.ExternalTensor(
            "placeholder", 0, int(size), value.dtype, shape=value.shape, name=value.name
        )
    return ir.serde.serialize_model(model).SerializeToString()
