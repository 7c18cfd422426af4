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
    store_linear_weights_transposed,
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
    _products_read_as_stored(graph, weights)
    transposed = store_linear_weights_transposed(graph)
    _products_read_as_stored(graph)  # the backward's, of the weights stored transposed
    own = {name.removeprefix("model.") for name in _params(metric)}
    externalize(graph, weights, names=transposed | own)
    weights.flush()
    onnxscript.optimizer.optimize(graph)
    _uniform_constants_made_at_load(graph)
    return save_checked(ir.to_proto(graph), path)


def _products_read_as_stored(graph: ir.Model, weights: WeightsFile | None = None) -> None:
    """Each MatMul(x, Transpose(W)) of an initializer W as Gemm(x, W, transB=1), x flattened
    to rows where it has more axes (the trace's shapes are static): ONNX Runtime would fold
    every Transpose of a weight into a transposed copy in memory at load, and the backward
    reads each linear weight both ways (the forward x @ W.T as stored, the backward g @ W).
    With `weights`: only where the file lacks W.T (the tied table, as the lens reads it;
    store_linear_weights_transposed would write it again, transposed); the double Transpose
    of the gradient through it goes too."""
    for node in list(graph.graph):
        table = node.inputs[0] if _transposes(node) else None
        if table is None or not table.is_initializer():
            continue
        if weights is not None and f"{table.name}.T" in weights:
            continue
        for user, index in list(node.outputs[0].uses()):
            if user.op_type == "MatMul" and index == 1 and _static(user):
                _as_gemm(graph, user, table)
            elif _transposes(user):
                user.outputs[0].replace_all_uses_with(table)
                graph.graph.remove(user, safe=True)
        if not node.outputs[0].uses():
            graph.graph.remove(node, safe=True)


def _static(product: ir.Node) -> bool:
    rows, out = product.inputs[0], product.outputs[0]
    shapes = (rows.shape if rows is not None else None, out.shape)
    return all(shape is not None and shape.is_static() for shape in shapes)


def _as_gemm(graph: ir.Model, product: ir.Node, weight: ir.Value) -> None:
    """MatMul(x, Transpose(weight)) -> Gemm(x as (rows, K), weight, transB=1), reshaped back."""
    x, out = product.inputs[0], product.outputs[0]
    assert x is not None and x.shape is not None and out.shape is not None
    nodes, rows = [], x
    if len(x.shape) != 2:
        flat = _constant(graph, f"{out.name}_rows", [-1, x.shape.numpy()[-1]])
        nodes.append(ir.node("Reshape", [x, flat]))
        rows = nodes[-1].outputs[0]
    nodes.append(ir.node("Gemm", [rows, weight], attributes={"transB": 1}))
    if len(x.shape) != 2:
        back = _constant(graph, f"{out.name}_shape", list(out.shape.numpy()))
        nodes.append(ir.node("Reshape", [nodes[-1].outputs[0], back]))
    graph.graph.insert_after(product, nodes)
    _take_place(out, nodes[-1].outputs[0])
    graph.graph.remove(product, safe=True)


def _constant(graph: ir.Model, name: str, values: list[int]) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(np.array(values, dtype=np.int64)))
    graph.graph.register_initializer(value)
    return value


def _transposes(node: ir.Node) -> bool:
    """Whether `node` is a matrix's Transpose."""
    return node.op_type == "Transpose" and list(node.attributes.get_ints("perm", [])) == [1, 0]


def _take_place(old: ir.Value, new: ir.Value) -> None:
    """`new` read wherever `old` was, under its name, shape and type."""
    old.replace_all_uses_with(new)
    new.shape, new.type = old.shape, old.type
    if not old.is_graph_output():
        new.name = old.name


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
        _take_place(value, made.outputs[0])


def check_gradient(model: Encoder, length: int, path: Path) -> dict[str, float]:
    """The graph against the model code on a random prompt, the metric read before its
    end: per output, the largest difference over that output's largest value."""
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
        fidelity[name] = float(np.abs(g - w).max() / max(float(np.abs(w).max()), 1e-30))
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
