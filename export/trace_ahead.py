"""Tracing a model's other graphs in a child process while this one traces the first.

Tracing is single-threaded Python: 5 to 10 seconds per graph for a two-layer model, about a
minute for a 1B model, and an export traces up to seven. The graphs depend on the config
alone (they are traced on the meta device), so with a second core a child process traces
the graphs after the first while this one traces the first and writes the weights, then
any the child has not begun; the child hands each back as ONNX bytes, its initializers
placeholders that export_onnx replaces by the real tensors.
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

# Even a two-layer model's graph takes seconds to trace (torch.export, then the ONNX
# passes), about what starting a child process that imports torch costs: with three graphs
# or more, sharing them with a child pays.
AHEAD_MIN_GRAPHS = 3


@contextlib.contextmanager
def tracer(
    config: ModelConfig, kinds: Sequence[str], ahead: bool | None = None
) -> Iterator[Callable[[str], ir.Model]]:
    """A function kind -> its traced graph. `ahead` (None: on two cores or more, where
    there are graphs enough to share): a child process traces the kinds after the first, in
    order, from now, and this one, whenever it waits, takes the last the child has not
    started, so the two share the work."""
    if ahead is None:
        ahead = len(kinds) >= AHEAD_MIN_GRAPHS and len(os.sched_getaffinity(0)) > 1
    if not ahead or len(kinds) < 2:
        yield lambda kind: trace(config, kind)
        return
    context = multiprocessing.get_context("spawn")  # no fork of a process running torch
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        pending = {kind: pool.submit(traced_bytes, config.to_json(), kind) for kind in kinds[1:]}
        here: dict[str, ir.Model] = {}

        def get(kind: str) -> ir.Model:
            if kind not in pending and kind not in here:
                return trace(config, kind)
            while kind in pending and not pending[kind].done():
                # a future the child has not taken can be cancelled: trace it here meanwhile
                waiting = next((k for k in reversed(pending) if pending[k].cancel()), None)
                if waiting is None:
                    break  # the child has every one left: wait for it
                del pending[waiting]
                here[waiting] = trace(config, waiting)
            if kind in here:
                return here.pop(kind)
            proto = onnx.ModelProto.FromString(pending.pop(kind).result())
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
