"""PyTorch -> ONNX with dynamic batch and sequence axes and the config in the metadata.

Each graph is traced from a shape-only twin of the model (on PyTorch's meta device: no
weights at all), then given its weights by name from any mapping of the encoder's tensors
(the float32 model's own, or a checkpoint's, each read from disk and widened as it is
written), streamed into the directory's one weights file (export/weights.py); only
then is the graph optimised and saved: what is written per graph is its structure.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path

import onnx_ir as ir
import onnxscript.optimizer
import torch

from attnserve.export.group_query import as_group_query_attention
from attnserve.export.head_fold import fold_head_transposes
from attnserve.export.onnx_files import save_checked
from attnserve.export.weights import WeightsFile, externalize, store_linear_weights_transposed
from attnserve.model.artifacts import (
    ATTRIBUTION_INPUTS,
    ATTRIBUTION_OUTPUTS,
    CHANGE_PARTS,
    CONFIG_METADATA_KEY,
    DECODE_INPUTS,
    LENS_INPUTS,
    LOGITS_NAME,
    PREDICTION_INPUTS,
    PREDICTION_OUTPUTS,
    VERSIONS_METADATA_KEY,
    cache_names,
    change_inputs,
    query_key_sites,
    unchanged,
)
from attnserve.model.config import ModelConfig
from attnserve.model.encoder import Encoder, rotary_modules
from attnserve.model.hook_points import captured, hooked, site_changes, stacked
from attnserve.model.hooks import changeable
from attnserve.model.readout_sites import readout_sites

# 23 is the first opset with the fused Attention op the embeddings-only graph uses.
ONNX_OPSET = 23


def exporter_versions() -> dict[str, str]:
    return {pkg: version(pkg) for pkg in ("attnserve", "torch", "onnx", "onnxscript")}


class _FullGraph(Encoder):
    """model_readouts.onnx: forward's outputs, the residual stream and the parts the blocks
    added to it (read at their hook points), under the interventions' changes (the inputs
    of artifacts.change_inputs, by name); model.onnx once they are taken out
    (_without_readouts)."""

    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, changes: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        sites = readout_sites(self.config)
        reads = [site for names in sites.values() for site in names]
        kinds = changeable(self.config)
        tensors = {
            kind: tuple(changes[f"{kind}_{part}"] for part in CHANGE_PARTS) for kind in kinds
        }
        with (
            hooked(self, site_changes(kinds, tensors)),  # type: ignore[arg-type]
            captured(self, reads) as values,
        ):
            embeddings, attentions = Encoder.forward(self, input_ids)
        assert attentions is not None
        return embeddings, attentions, *stacked(values, sites).values()


class _DecodeGraph(Encoder):
    """model_decode.onnx: one step of generation with a KV cache (Encoder.decode), under the
    interventions' changes, as the readouts graph takes them."""

    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        past_mask: torch.Tensor,
        past: list[torch.Tensor],
        changes: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        kinds = changeable(self.config)
        tensors = {
            kind: tuple(changes[f"{kind}_{part}"] for part in CHANGE_PARTS) for kind in kinds
        }
        layers = list(zip(past[::2], past[1::2], strict=True))
        with hooked(self, site_changes(kinds, tensors)):  # type: ignore[arg-type]
            logits, presents = self.decode(input_ids, past_mask, layers)
        return logits, *(x for layer in presents for x in layer)


class _EmbeddingsGraph(Encoder):
    """model_embeddings.onnx: the fused attention path, input_ids -> embeddings."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return Encoder.forward(self, input_ids, need_weights=False)[0]


class _QueriesGraph(Encoder):
    """model_queries.onnx: the fused attention path, input_ids -> embeddings and every
    layer's queries and keys as its scores read them (artifacts.query_key_sites)."""

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        sites = list(query_key_sites(self.config).values())
        with captured(self, sites) as values:
            embeddings = Encoder.forward(self, input_ids, need_weights=False)[0]
        return embeddings, *(values[site] for site in sites)  # (B, T, D), (B, T, H or H_kv, dh)


class _LensGraph(Encoder):
    """model_lens.onnx: residual rows (N, D) and the last layer's at the same positions ->
    logits (N, V)."""

    def forward(self, residual: torch.Tensor, last: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.lens(residual, last)


class _AttributionGraph(Encoder):
    """model_attribution.onnx: Encoder.attribution."""

    def forward(  # type: ignore[override]
        self,
        head_outputs: torch.Tensor,
        mlp_outputs: torch.Tensor,
        first: torch.Tensor,
        last: torch.Tensor,
        targets: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        return self.attribution(head_outputs, mlp_outputs, first, last, targets)


_MODULES = {
    "full": _FullGraph,
    "embeddings": _EmbeddingsGraph,
    "lens": _LensGraph,
    "attribution": _AttributionGraph,
    "decode": _DecodeGraph,
    "queries": _QueriesGraph,
}


def trace(config: ModelConfig, kind: str) -> ir.Model:
    """The graph of `kind` (a traced row of model/artifacts.py GRAPHS) for `config`, its
    initializers named after the encoder's tensors and without values (traced on the meta
    device)."""
    module = _MODULES[kind]
    with torch.device("meta"):
        model = module(config)
    example, keywords, dynamic_shapes = _examples(config, kind)
    inputs, outputs = _io_names(config)[kind]
    quiet_exporter()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch-internal deprecation noise
        # Two inputs share an axis (batch, rows): the exporter says it names it once.
        warnings.filterwarnings("ignore", "# The axis name")
        program = torch.onnx.export(
            model.eval(),
            example,
            kwargs=keywords,
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            input_names=inputs,
            output_names=outputs,
            opset_version=ONNX_OPSET,
            # Optimised below, once the weights are in the file: folding first would make
            # a transposed copy of every weight in memory.
            optimize=False,
            verbose=False,
        )
    assert program is not None  # torch returns None only for the legacy exporter
    if kind in ("full", "decode"):
        _free_change_axes(program.model, config)
    return program.model


def _io_names(config: ModelConfig) -> dict[str, tuple[list[str], list[str]]]:
    """Each kind's (input names, output names)."""
    return {
        "full": (
            [config.input_name, *change_inputs(config)],
            [config.embeddings_name, config.attentions_name, *readout_sites(config)],
        ),
        "embeddings": ([config.input_name], [config.embeddings_name]),
        "queries": ([config.input_name], [config.embeddings_name, *query_key_sites(config)]),
        "lens": (list(LENS_INPUTS), [LOGITS_NAME]),
        "attribution": (list(ATTRIBUTION_INPUTS), list(ATTRIBUTION_OUTPUTS.values())),
        "decode": (
            [*DECODE_INPUTS, *cache_names(config, "past_key_values"), *change_inputs(config)],
            [LOGITS_NAME, *cache_names(config, "present")],
        ),
    }


def _examples(config: ModelConfig, kind: str) -> tuple[tuple, dict, dict]:
    """What a graph of `kind` is traced with: example inputs, keyword inputs and the dynamic
    shapes of both."""
    # The traced examples only have to be valid; the axes named here are symbolic.
    keywords: dict = {}
    batch = torch.export.Dim("batch", min=1)
    seq = torch.export.Dim("seq", min=1, max=config.max_seq_len)
    t = min(8, config.max_seq_len)
    if kind == "lens":
        rows = torch.export.Dim("rows", min=1)
        example: tuple = tuple(torch.zeros(2, config.d_model, device="meta") for _ in LENS_INPUTS)
        dynamic_shapes: dict = {"residual": {0: rows}, "last": {0: rows}}
    elif kind == "attribution":
        rows = torch.export.Dim("rows", min=1)
        L, D = config.n_layers, config.d_model
        example = (
            torch.zeros(2, L, config.n_heads * config.head_dim, device="meta"),
            torch.zeros(2, L, D, device="meta"),
            torch.zeros(2, D, device="meta"),
            torch.zeros(2, D, device="meta"),
            torch.zeros(2, 3, dtype=torch.int64, device="meta"),
        )
        dynamic_shapes = {name: {0: rows} for name in ATTRIBUTION_INPUTS}
        dynamic_shapes["targets"] = {0: rows, 1: torch.export.Dim("n", min=1)}
    else:
        example = (torch.zeros(2, t, dtype=torch.int64, device="meta"),)
        dynamic_shapes = {"input_ids": {0: batch, 1: seq}}
        if kind == "decode":  # the past: one key (a prompt's padding) or more
            past = torch.export.Dim("past", min=1, max=config.max_seq_len)
            cache = (2, config.kv_heads, 3, config.head_dim)
            caches = [torch.zeros(cache, device="meta") for _ in range(2 * config.n_layers)]
            example = (*example, torch.zeros(2, 3, dtype=torch.int64, device="meta"), caches)
            dynamic_shapes["past_mask"] = {0: batch, 1: past}
            dynamic_shapes["past"] = [{0: batch, 2: past}] * (2 * config.n_layers)
        if kind in ("full", "decode"):  # traced at the smallest shapes: axes freed after
            changes = {
                name: torch.zeros(x.shape, device="meta") for name, x in unchanged(config).items()
            }
            keywords = {"changes": changes}
            dynamic_shapes["changes"] = dict.fromkeys(changes)  # static: freed after the trace
    return example, keywords, dynamic_shapes


def _free_change_axes(model: ir.Model, config: ModelConfig) -> None:
    """The intervention inputs, traced at (1, L, 1, 1), declared for any broadcastable
    shape: every axis but the layers' named (dims of 1 broadcast in ONNX as in numpy), and
    the shapes the trace recorded of what is made of them alone forgotten (the Gathers of
    one layer's slice; ONNX Runtime infers them again)."""
    inputs = change_inputs(config)
    derived: set[ir.Value] = set()
    for value in model.graph.inputs:
        if value.name in inputs:
            assert value.shape is not None  # traced inputs have their shapes
            axes = range(len(value.shape))
            value.shape = ir.Shape(
                [config.n_layers if axis == 1 else f"{value.name}_{axis}" for axis in axes]
            )
            derived.add(value)
    constant: set[ir.Value] = set()
    for node in model.graph:  # in order: a node's inputs come before it
        given = [v for v in node.inputs if v is not None and v.const_value is None]
        given = [v for v in given if v not in constant]
        if not given:  # Constant nodes, and what is computed of them alone
            constant.update(node.outputs)
        elif all(v in derived for v in given):
            for output in node.outputs:
                output.shape = None
                derived.add(output)


def _with_predictions(model: ir.Model) -> None:
    """Append to the lens graph what a reader wants of its logits, so that the vocabulary-
    wide rows never leave ONNX Runtime unless asked for: the softmax's k largest
    probabilities and their ids (k an input), and the probabilities of given target ids."""
    graph = model.graph
    logits = graph.outputs[0]
    int64 = ir.TensorType(ir.DataType.INT64)
    k = ir.Value(name=PREDICTION_INPUTS[0], shape=ir.Shape([1]), type=int64)
    targets = ir.Value(name=PREDICTION_INPUTS[1], shape=ir.Shape(["rows", "n"]), type=int64)
    graph.inputs.extend([k, targets])
    softmax = ir.node("Softmax", [logits], attributes={"axis": -1})
    top = ir.node("TopK", [softmax.outputs[0], k], attributes={"axis": -1}, num_outputs=2)
    chosen = ir.node("GatherElements", [softmax.outputs[0], targets], attributes={"axis": -1})
    graph.extend([softmax, top, chosen])
    softmax.outputs[0].name = "probabilities"
    float32 = ir.TensorType(ir.DataType.FLOAT)
    probabilities, ids = top.outputs
    outputs = {
        ids: (int64, ["rows", "k"]),
        probabilities: (float32, ["rows", "k"]),
        chosen.outputs[0]: (float32, ["rows", "n"]),
    }
    for (value, (dtype, dims)), name in zip(outputs.items(), PREDICTION_OUTPUTS, strict=True):
        value.name, value.type, value.shape = name, dtype, ir.Shape(dims)
        graph.outputs.append(value)


def _as_float32(tensors: Mapping[str, torch.Tensor], value: ir.Value) -> ir.TensorProtocol:
    """The initializer `value`'s tensor, looked up in `tensors` (a checkpoint reads it from
    disk then) and converted to float32 only when it is written: one at a time."""
    name = str(value.name)

    def load() -> ir.Tensor:
        return ir.Tensor(tensors[name].detach().float().contiguous().numpy(), name=name)

    assert value.shape is not None  # traced initializers have their shapes
    return ir.LazyTensor(load, ir.DataType.FLOAT, value.shape, name=name)


def quiet_exporter() -> None:
    """The dynamo exporter logs missing optional torchvision ops at WARNING, and the graph
    passes each rewrite at INFO (hundreds of lines for a 1B model): irrelevant to a user."""
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    for passes in ("onnxscript", "onnx_ir"):
        logging.getLogger(passes).setLevel(logging.WARNING)


def export_onnx(
    config: ModelConfig,
    tensors: Mapping[str, torch.Tensor],
    path: str | Path,
    weights: WeightsFile,
    kind: str = "full",
    readouts_path: str | Path | None = None,
    graph: ir.Model | None = None,
) -> Path:
    """Export the graph of `kind` (full, embeddings or lens) of the encoder of `config`
    with `tensors` (its state_dict, any float dtype) to `path`, its weights into `weights`
    (written once across graphs), and check the file. The full graph is traced with the
    readouts (a head mask in, the residual stream out): written as such to
    `readouts_path` if given, and without them to `path`. `graph`: the trace, if made
    already (export/trace_ahead.py)."""
    graph = graph or trace(config, kind)
    rotary = {
        f"{name}.{buffer}": value
        for name, module in rotary_modules(config).items()
        for buffer, value in module.named_buffers()
    }
    for name, value in graph.graph.initializers.items():
        if name not in tensors and name not in rotary:
            raise KeyError(f"no tensor {name!r} for the traced graph")
        value.const_value = _as_float32(tensors if name in tensors else rotary, value)
    transposed = store_linear_weights_transposed(graph)
    externalize(graph, weights, names=transposed | set(tensors))
    weights.flush()
    onnxscript.optimizer.optimize(graph)
    if kind == "lens":
        _with_predictions(graph)
    if kind == "embeddings":  # the only graph with the fused Attention op to fold into
        graph = fold_head_transposes(graph, config.n_heads, config.kv_heads)
    if kind == "queries":
        as_group_query_attention(graph, config)
    if kind == "full" and readouts_path is not None:
        _save(graph, config, readouts_path)
    if kind == "full":
        _without_readouts(graph, config)
    return _save(graph, config, path)


def _save(graph: ir.Model, config: ModelConfig, path: str | Path) -> Path:
    """The graph with the config and the exporter's versions in its metadata, checked."""
    graph.metadata_props.update(
        {
            CONFIG_METADATA_KEY: config.to_json(),
            VERSIONS_METADATA_KEY: json.dumps(exporter_versions(), sort_keys=True),
        }
    )
    outputs = [v.name for v in graph.graph.outputs]
    graph.doc_string = f"attnserve causal self-attention encoder {config.name}: {outputs}"
    return save_checked(ir.to_proto(graph), path)


def _without_readouts(model: ir.Model, config: ModelConfig) -> None:
    """The readouts graph made model.onnx: no interventions (their inputs made constants
    that change nothing, and the products and sums with them dropped) and no residual stream
    or parts (what only fed them goes with them)."""
    graph = model.graph
    for output in [v for v in graph.outputs if v.name in readout_sites(config)]:
        graph.outputs.remove(output)
    for name, value in unchanged(config).items():
        given = next(v for v in graph.inputs if v.name == name)
        graph.inputs.remove(given)
        given.const_value = ir.tensor(value, name=name)
        graph.register_initializer(given)
    onnxscript.optimizer.fold_constants(model)  # each layer's slice: a constant too
    for node in list(graph):
        kept = _identity_input(node)
        if kept is not None:
            node.outputs[0].replace_all_uses_with(kept)
    ir.passes.common.RemoveUnusedNodesPass()(model)


def _identity_input(node: ir.Node) -> ir.Value | None:
    """The input a Mul by ones or an Add of zeros passes through unchanged (a constant of
    dims 1, of no higher rank: broadcasting it changes no shape), or None."""
    neutral = {"Mul": 1.0, "Add": 0.0}.get(node.op_type)
    if neutral is None or len(node.inputs) != 2:
        return None
    for constant, other in (node.inputs, node.inputs[::-1]):
        tensor = ir.convenience.get_const_tensor(constant) if constant is not None else None
        if tensor is None or other is None or other.shape is None:
            continue
        values = tensor.numpy()
        if values.size == 1 and values.ndim <= len(other.shape) and values.item() == neutral:
            return other
    return None
