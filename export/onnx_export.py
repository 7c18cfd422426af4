"""PyTorch -> ONNX with dynamic batch and sequence axes and the config in the metadata.

Each graph is traced from a shape-only twin of the model (on PyTorch's meta device: no
weights at all), then given its weights by name from any mapping of the encoder's tensors
(the float32 model's own, or a checkpoint's bfloat16 ones, widened one at a time as they
are written), streamed into the directory's one weights file (export/weights.py); only
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

from attnserve.export.head_fold import fold_head_transposes
from attnserve.export.onnx_files import save_checked
from attnserve.export.weights import WeightsFile, externalize, store_linear_weights_transposed
from attnserve.model.artifacts import CONFIG_METADATA_KEY, VERSIONS_METADATA_KEY
from attnserve.model.config import ModelConfig
from attnserve.model.encoder import Encoder, rotary_modules

# 23 is the first opset with the fused Attention op the embeddings-only graph uses.
ONNX_OPSET = 23


def exporter_versions() -> dict[str, str]:
    return {pkg: version(pkg) for pkg in ("attnserve", "torch", "onnx", "onnxscript")}


def trace(config: ModelConfig, with_attentions: bool) -> ir.Model:
    """The encoder's graph for `config`, its initializers named after the encoder's tensors
    and without values (traced on the meta device).

    with_attentions=False traces the fused attention path: input_ids -> embeddings.
    """
    with torch.device("meta"):
        model = Encoder(config)
    outputs = [config.embeddings_name] + ([config.attentions_name] if with_attentions else [])
    # The traced example only has to be valid; both axes are symbolic in the graph.
    example = torch.zeros(2, min(8, config.max_seq_len), dtype=torch.int64, device="meta")
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


def _as_float32(tensor: torch.Tensor, name: str) -> ir.TensorProtocol:
    """`tensor` as an ONNX tensor, converted to float32 only when it is written."""
    if not tensor.is_floating_point():
        return ir.Tensor(tensor.numpy(), name=name)

    def widen() -> ir.Tensor:
        return ir.Tensor(tensor.detach().float().contiguous().numpy(), name=name)

    return ir.LazyTensor(widen, ir.DataType.FLOAT, ir.Shape(tuple(tensor.shape)), name=name)


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
    config: ModelConfig,
    tensors: Mapping[str, torch.Tensor],
    path: str | Path,
    weights: WeightsFile,
    with_attentions: bool = True,
) -> Path:
    """Export the encoder of `config` with `tensors` (its state_dict, any float dtype) to
    `path`, its weights into `weights` (written once across graphs), and check the file.

    with_attentions=False exports the embeddings-only graph.
    """
    graph = trace(config, with_attentions)
    rotary = {
        f"{name}.{buffer}": value
        for name, module in rotary_modules(config).items()
        for buffer, value in module.named_buffers()
    }
    for name, value in graph.graph.initializers.items():
        source = tensors.get(name, rotary.get(name))
        if source is None:
            raise KeyError(f"no tensor {name!r} for the traced graph")
        value.const_value = _as_float32(source, name)
    transposed = store_linear_weights_transposed(graph)
    externalize(graph, weights, names=transposed | set(tensors))
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
