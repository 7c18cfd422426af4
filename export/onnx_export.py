"""PyTorch -> ONNX with dynamic batch and sequence axes and the config in the metadata.

Each graph is traced from the model itself (no copy of its weights is made), its weights
are streamed into the directory's one weights file (export/weights.py), and only then is
the graph optimised and saved: what is written per graph is its structure, a few MB.
"""

from __future__ import annotations

import json
import logging
import warnings
from importlib.metadata import version
from pathlib import Path

import onnx_ir as ir
import onnxscript.optimizer
import torch

from attnserve.export.head_fold import fold_head_transposes
from attnserve.export.onnx_files import save_checked
from attnserve.export.weights import WeightsFile, externalize, store_linear_weights_transposed
from attnserve.model.artifacts import CONFIG_METADATA_KEY, VERSIONS_METADATA_KEY
from attnserve.model.encoder import Encoder

# 23 is the first opset with the fused Attention op the embeddings-only graph uses.
ONNX_OPSET = 23


def exporter_versions() -> dict[str, str]:
    return {pkg: version(pkg) for pkg in ("attnserve", "torch", "onnx", "onnxscript")}


def trace(model: Encoder, with_attentions: bool) -> ir.Model:
    """The model's graph, its initializers still the model's own tensors (not copies).

    with_attentions=False traces the fused attention path: input_ids -> embeddings.
    """
    config = model.config
    outputs = [config.embeddings_name] + ([config.attentions_name] if with_attentions else [])
    # The traced example only has to be valid; both axes are symbolic in the graph.
    example = torch.zeros(2, min(8, config.max_seq_len), dtype=torch.int64)
    dynamic_shapes = {
        "input_ids": {
            0: torch.export.Dim("batch", min=1),
            1: torch.export.Dim("seq", min=1, max=config.max_seq_len),
        },
        "need_weights": None,
    }
    # The dynamo exporter logs missing optional torchvision ops at WARNING; irrelevant here.
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch-internal deprecation noise
        # The exporter cannot rename the axes of a non-tensor argument: _name_axes does.
        warnings.filterwarnings("ignore", "# ONNX model has different number of inputs")
        program = torch.onnx.export(
            model.eval(),
            (example,),
            kwargs={"need_weights": with_attentions},
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            input_names=[config.input_name],
            output_names=outputs,
            opset_version=ONNX_OPSET,
            # Optimised below, once the weights are in the file: folding first would make
            # a transposed copy of every weight in memory.
            optimize=False,
            verbose=False,
        )
    assert program is not None  # torch returns None only for the legacy exporter
    _name_axes(program.model, {0: "batch", 1: "seq"})
    return program.model


def _name_axes(model: ir.Model, names: dict[int, str]) -> None:
    """Give the input's symbolic axes readable names, in every shape that uses them (the
    exporter renames them only for inputs that are all tensors)."""
    dims = model.graph.inputs[0].shape
    assert dims is not None
    renamed = {str(dims[axis]): name for axis, name in names.items()}
    values = [
        *model.graph.inputs,
        *(out for node in model.graph.all_nodes() for out in node.outputs),
    ]
    for value in values:
        if value.shape is not None and any(str(d) in renamed for d in value.shape):
            value.shape = ir.Shape([renamed.get(str(d), d) for d in value.shape])


def export_onnx(
    model: Encoder, path: str | Path, weights: WeightsFile, with_attentions: bool = True
) -> Path:
    """Export `model` to `path`, its weights into `weights` (written once across graphs),
    and check the file.

    with_attentions=False exports the embeddings-only graph.
    """
    config = model.config
    graph = trace(model, with_attentions)
    transposed = store_linear_weights_transposed(graph)
    externalize(graph, weights, names=transposed | set(model.state_dict()))
    onnxscript.optimizer.optimize(graph)
    if not with_attentions:  # the traced full graph has no Attention op to fold into
        graph = fold_head_transposes(graph, config.n_heads, config.kv_heads)
    graph.metadata_props.update(
        {
            CONFIG_METADATA_KEY: config.to_json(),
            VERSIONS_METADATA_KEY: json.dumps(exporter_versions(), sort_keys=True),
        }
    )
    outputs = [v.name for v in graph.graph.outputs]
    graph.doc_string = f"attnserve causal self-attention encoder {config.name}: {outputs}"
    return save_checked(ir.to_proto(graph), path)
