"""The replacement model's backward as an ONNX graph (model/replacement.py BackwardGraph).

Traced by torch's dynamo exporter from the model code under autograd: the graph holds the
prompt's forward (to freeze its patterns and norm scales and read the transcoders'
inputs, the MLPs' outputs and the logits) and the transposed linear map of the frozen
model, MatMul, Transpose, Mul and sums; rows and positions are free axes. Its weights are
the model's own by name (a WeightsFile shared with the model's graphs writes each once).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import onnx_ir as ir
import onnxscript
import torch

from attnserve.export.onnx_export import ONNX_OPSET, quiet_exporter
from attnserve.export.onnx_files import save_checked
from attnserve.export.weights import WeightsFile, externalize, store_linear_weights_transposed
from attnserve.model.encoder import Encoder
from attnserve.model.replacement import BackwardGraph, Transcoders

BACKWARD_INPUTS = ("input_ids", "grads", "layers", "positions")
# the rows' gradients at every hook_mlp_out and at hook_embed; the prompt's transcoder
# inputs, MLP outputs and last logits
BACKWARD_OUTPUTS = ("mlp_grads", "embed_grads", "transcoder_inputs", "mlp_outputs", "logits")
_PREFIX = "model."  # BackwardGraph's attribute holding the encoder


def export_backward(
    model: Encoder, transcoders: Transcoders, path: str | Path, weights: WeightsFile
) -> Path:
    """Trace the backward of `model`'s replacement by `transcoders` to `path`, its tensors
    in `weights` under the encoder's own parameter names, and check the file."""
    graph = BackwardGraph(model, transcoders).eval()
    rows, seq = torch.export.Dim("rows", min=1), torch.export.Dim("seq", min=2)
    D = model.config.d_model
    examples = (
        torch.zeros(1, 3, dtype=torch.long),
        torch.zeros(2, D),
        torch.tensor([0, model.config.n_layers]),
        torch.tensor([0, 2]),
    )
    quiet_exporter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            graph,
            examples,
            dynamo=True,
            verbose=False,
            opset_version=ONNX_OPSET,
            # optimised once the weights are in the file: folding first would make a
            # transposed copy of every weight (as export/onnx_export.py trace)
            optimize=False,
            input_names=list(BACKWARD_INPUTS),
            output_names=list(BACKWARD_OUTPUTS),
            dynamic_shapes={
                "input_ids": {1: seq},
                "grads": {0: rows},
                "layers": {0: rows},
                "positions": {0: rows},
            },
        )
    assert program is not None
    traced = program.model
    for name, value in list(traced.graph.initializers.items()):
        if name.startswith(_PREFIX):  # the encoder's names, as its other graphs hold them
            traced.graph.initializers.pop(name)
            value.name = name.removeprefix(_PREFIX)
            traced.graph.initializers.add(value)
    transposed = store_linear_weights_transposed(traced)
    own = {name for name, _ in (*graph.named_parameters(), *graph.named_buffers())}
    own = {name.removeprefix(_PREFIX) for name in own}
    externalize(traced, weights, names=transposed | own)
    weights.flush()
    onnxscript.optimizer.optimize(traced)
    return save_checked(ir.to_proto(traced), path)
