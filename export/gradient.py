"""The metric's real gradient as ONNX graphs, one per prompt length (model/gradient.py).

`torch.func.vjp` of the metric is traced by make_fx into aten ops (`_softmax_backward_data`,
`gelu_backward` and the like) and that graph goes through the dynamo exporter to plain ONNX
ops (research/real-backward). Its length stays the trace's: make_fx writes it into the
views it records (research/real-backward/dynamic_length.py), hence a graph per length and
prompts padded on the right to one. Its weights are the model's own by name: each graph
points into weights.data and holds only what the file lacks (the rotary tables).
"""

from __future__ import annotations

import functools
import json
import logging
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import onnxscript
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

from attnserve.export.onnx_export import ONNX_OPSET, quiet_exporter
from attnserve.export.onnx_files import save_checked
from attnserve.export.read_back import read_encoder
from attnserve.export.weights import (
    WeightsFile,
    externalize,
    named_as_encoder,
    products_read_as_stored,
    store_linear_weights_transposed,
    take_place,
)
from attnserve.model.artifacts import (
    GRADIENT_INPUTS,
    REPORT_FILENAME,
    WEIGHTS_INDEX_FILENAME,
    gradient_files,
    gradient_outputs,
)
from attnserve.model.encoder import Encoder
from attnserve.model.gradient import Metric, metric_gradients

# The most an output may differ from the model code, over its largest value (ORT's own
# kernels against torch's: 1e-6 measured)
GRADIENT_TOLERANCE = 1e-4
_UNIFORM = 1024  # elements: an initializer of one value this large is made at load
_PREFIX = "metric.model."  # the encoder's parameters, as _GradientGraph holds them


class GradientError(ValueError):
    """A length no graph can be written for, or a graph that misses the model code."""


class _GradientGraph(nn.Module):
    """What the exporter traces: the aten graph of metric_gradients, its parameters bound."""

    def __init__(self, metric: Metric, traced: Callable[..., tuple[torch.Tensor, ...]]) -> None:
        super().__init__()
        self.metric = metric
        self._traced = (traced,)  # a plain callable, not a submodule: its params are ours

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self._traced[0](_params(self.metric), *inputs)


def _params(metric: Metric) -> dict[str, torch.Tensor]:
    return dict([*metric.named_parameters(), *metric.named_buffers()])


def _examples(length: int) -> tuple[torch.Tensor, ...]:
    """A prompt of `length` and the metric's position, target and contrast."""
    return (
        torch.zeros(1, length, dtype=torch.long),
        torch.tensor([length - 1]),
        torch.tensor([0]),
        torch.tensor([1]),
    )


def export_gradient(model: Encoder, length: int, path: Path, weights: WeightsFile) -> Path:
    """Trace the metric's gradient for prompts of `length` to `path`, its tensors in
    `weights` under the encoder's own names, and check the file."""
    metric = Metric(model).eval()
    examples = _examples(length)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = make_fx(functools.partial(metric_gradients, metric), tracing_mode="fake")(
            _params(metric), *examples
        )
        quiet_exporter()
        # the aten graph's sums over no axes (dim=[]) make empty attributes, each warned of
        logging.getLogger("onnx_ir._convenience").setLevel(logging.ERROR)
        program = torch.onnx.export(
            _GradientGraph(metric, traced),
            examples,
            dynamo=True,
            verbose=False,
            opset_version=ONNX_OPSET,
            optimize=False,  # after the weights are in the file (export/backward.py)
            input_names=list(GRADIENT_INPUTS),
            output_names=gradient_outputs(model.config),
        )
    assert program is not None
    graph = program.model
    named_as_encoder(graph, _PREFIX)
    products_read_as_stored(graph, weights)
    transposed = store_linear_weights_transposed(graph)
    products_read_as_stored(graph)  # the backward's, of the weights stored transposed
    own = {name.removeprefix("model.") for name in _params(metric)}
    externalize(graph, weights, names=transposed | own)
    weights.flush()
    onnxscript.optimizer.optimize(graph)
    _uniform_constants_made_at_load(graph)
    return save_checked(ir.to_proto(graph), path)


def _uniform_constants_made_at_load(graph: ir.Model) -> None:
    """The optimizer folds the zeros each gradient starts from, (1, L, T, width) per kind
    (Expand of a scalar), into initializers: megabytes of zeros in the file for a real
    model. Each large initializer of one value becomes ConstantOfShape again."""
    for name, value in list(graph.graph.initializers.items()):
        tensor = value.const_value
        if tensor is None or isinstance(tensor, ir.ExternalTensor) or tensor.size < _UNIFORM:
            continue
        array = tensor.numpy()
        first = array.reshape(-1)[:1]
        if not (array == first).all():
            continue
        shape = ir.Value(
            name=f"{name}_shape", const_value=ir.tensor(np.array(array.shape, dtype=np.int64))
        )
        graph.graph.register_initializer(shape)
        made = ir.node("ConstantOfShape", [shape], attributes={"value": ir.tensor(first)})
        graph.graph.insert_before(graph.graph[0], made)
        graph.graph.initializers.pop(name)
        take_place(value, made.outputs[0])


def check_gradient(model: Encoder, length: int, path: Path) -> dict[str, float]:
    """The graph against the model code on a random prompt, the metric read before its
    end: per output, the largest difference over that output's largest value where it
    passes 1 (the model's gates' convention: a logit difference near zero, as a random
    prompt's may be, is held to 1e-4 of a logit, not of itself)."""
    config = model.config
    generator = torch.Generator().manual_seed(0)
    feeds = (
        torch.randint(0, config.vocab_size, (1, length), generator=generator),
        torch.tensor([max(0, length - 3)]),
        *torch.randint(0, config.vocab_size, (2, 1), generator=generator),
    )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, dict(zip(GRADIENT_INPUTS, (t.numpy() for t in feeds), strict=True)))
    metric = Metric(model).eval()
    want = metric_gradients(metric, _params(metric), *feeds)
    fidelity = {}
    for name, g, value in zip(gradient_outputs(config), got, want, strict=True):
        w = value.detach().numpy()
        fidelity[name] = float(np.abs(g - w).max() / max(float(np.abs(w).max()), 1.0))
    return fidelity


def write_gradients(
    model_dir: Path, lengths: Iterable[int], log: Callable[[str], None] = print
) -> list[Path]:
    """The gradient graphs of the model in `model_dir` for prompts of each length (those
    over its max_seq_len left out), checked against the model code; their fidelity goes in
    export_report.json as `gradient_fidelity` by length."""
    model = read_encoder(model_dir)
    config = model.config
    if config.unembedding == "none":
        raise GradientError(f"{config.name} has no unembedding: no logit to take a gradient of")
    wanted = sorted(set(lengths))
    if not wanted or wanted[0] < 1:
        raise GradientError(f"lengths: {wanted} must be positive")
    kept = [length for length in wanted if length <= config.max_seq_len] or [config.max_seq_len]
    report_path = model_dir / REPORT_FILENAME
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    written = []
    for length in kept:
        graph_name, data_name = gradient_files(length)
        log(f"tracing the gradient for prompts of {length} tokens ({config.n_layers} layers)...")
        with WeightsFile(model_dir / data_name) as weights:
            weights.know(model_dir / WEIGHTS_INDEX_FILENAME)
            path = export_gradient(model, length, model_dir / graph_name, weights)
            own = weights.nbytes
        if not own:  # nothing the model's file lacks
            (model_dir / data_name).unlink()
        log("checking: PyTorch vs ONNX Runtime CPU...")
        fidelity = check_gradient(model, length, path)
        worst = max(fidelity, key=fidelity.__getitem__)
        if fidelity[worst] > GRADIENT_TOLERANCE:
            path.unlink()
            raise GradientError(
                f"the gradient graph of {length} tokens differs from the model code by "
                f"{fidelity[worst]:.1e} of its largest {worst}, over {GRADIENT_TOLERANCE:g}"
            )
        report.setdefault("gradient_fidelity", {})[str(length)] = fidelity
        written.append(path)
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    return written
