"""The replacement model's backward as an ONNX graph (model/replacement.py BackwardGraph).

Traced by torch's dynamo exporter from the model code under autograd: the graph holds the
prompt's forward (to freeze its patterns and norm scales and read the transcoders'
inputs, the MLPs' outputs and the logits) and the transposed linear map of the frozen
model, MatMul, Transpose, Mul and sums; the prompt's length and each layer's rows are free
axes. Its weights are the model's own by name (a WeightsFile shared with the model's
graphs writes each once).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import onnxscript
import torch

from attnserve.export.onnx_export import ONNX_OPSET, quiet_exporter
from attnserve.export.onnx_files import save_checked
from attnserve.export.read_back import read_encoder
from attnserve.export.weights import (
    WeightsFile,
    externalize,
    named_as_encoder,
    products_read_as_stored,
    store_linear_weights_transposed,
)
from attnserve.model.artifacts import (
    BACKWARD_OUTPUTS,
    WEIGHTS_INDEX_FILENAME,
    backward_files,
    backward_inputs,
)
from attnserve.model.encoder import Encoder
from attnserve.model.hooks import MLP_OUT
from attnserve.model.replacement import BackwardGraph, Transcoders
from attnserve.model.sae_config import SAEConfig

_PREFIX = "model."  # BackwardGraph's attribute holding the encoder


def export_backward(
    model: Encoder, transcoders: Transcoders, path: str | Path, weights: WeightsFile
) -> Path:
    """Trace the backward of `model`'s replacement by `transcoders` to `path`, its tensors
    in `weights` under the encoder's own parameter names, and check the file."""
    graph = BackwardGraph(model, transcoders).eval()
    seq = torch.export.Dim("seq", min=2)
    D, L = model.config.d_model, model.config.n_layers
    # every layer's row count free (the example's 2 and 3 rows: not 0 or 1, which the
    # exporter would take for constants)
    rows = [torch.export.Dim(f"rows_{layer}", min=1) for layer in range(L + 1)]
    examples = (
        torch.zeros(1, 3, dtype=torch.long),
        [torch.zeros(2 + layer % 2, D) for layer in range(L + 1)],
        [torch.tensor([0, 2, 1][: 2 + layer % 2]) for layer in range(L + 1)],
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
            input_names=list(backward_inputs(L)),
            output_names=list(BACKWARD_OUTPUTS),
            dynamic_shapes={
                "input_ids": {1: seq},
                "grads": [{0: n} for n in rows],
                "positions": [{0: n} for n in rows],
            },
        )
    assert program is not None
    traced = program.model
    named_as_encoder(traced, _PREFIX)
    transposed = store_linear_weights_transposed(traced)
    products_read_as_stored(traced)  # the backward's, of the weights stored transposed
    own = {name for name, _ in (*graph.named_parameters(), *graph.named_buffers())}
    own = {name.removeprefix(_PREFIX) for name in own}
    externalize(traced, weights, names=transposed | own)
    weights.flush()
    onnxscript.optimizer.optimize(traced)
    return save_checked(ir.to_proto(traced), path)


def write_backward(
    model_dir: Path,
    set_name: str,
    members: Sequence[tuple[str, SAEConfig, torch.Tensor | None]],
    scan: str,
    log: Callable[[str], None] = print,
) -> Path:
    """The backward graph of the model in `model_dir` with the transcoder set `set_name`
    (members: each layer's SAE name, config and skip W_skip or None, layer by layer; scan:
    circuit-tracer's identifier of the set, which its graphs' metadata name),
    sharing the model's weights file, checked against the model code; with its
    description (model/artifacts.py backward_files)."""
    model = read_encoder(model_dir)
    transcoders = Transcoders(
        input_template(members, model.config.n_layers), [s for *_, s in members]
    )
    graph_name, data_name, info_name = backward_files(set_name)
    log(f"tracing the replacement model's backward ({model.config.n_layers} layers)...")
    with WeightsFile(model_dir / data_name) as weights:
        weights.know(model_dir / WEIGHTS_INDEX_FILENAME)
        path = export_backward(model, transcoders, model_dir / graph_name, weights)
    log("checking: PyTorch vs ONNX Runtime CPU...")
    fidelity = check_backward(model, transcoders, path)
    info = {
        "members": [name for name, *_ in members],
        "scan": scan,
        "input_site": transcoders.input_site,
        "skip": any(s is not None for s in transcoders.skips),
        "fidelity": fidelity,
    }
    (model_dir / info_name).write_text(json.dumps(info, indent=2) + "\n")
    return path


def input_template(members: Sequence[tuple[str, SAEConfig, object]], layers: int) -> str:
    """The site every member reads, "{layer}" unfilled: one per layer, in order, each
    writing its layer's hook_mlp_out (circuit-tracer's single-layer transcoders)."""
    if len(members) != layers:
        raise ValueError(f"a replacement model needs a transcoder on each of {layers} layers, "
                         f"not {len(members)}")  # fmt: skip
    templates = set()
    for layer, (name, config, _) in enumerate(members):
        prefix = f"blocks.{layer}."
        if not config.hook_name.startswith(prefix) or config.output_hook != MLP_OUT.format(
            layer=layer
        ):
            raise ValueError(f"{name}: reads {config.hook_name} and writes "
                             f"{config.output_hook}, not layer {layer}'s MLP's place")  # fmt: skip
        templates.add("blocks.{layer}." + config.hook_name.removeprefix(prefix))
    if len(templates) != 1:
        raise ValueError(f"the set's transcoders read different sites: {sorted(templates)}")
    return templates.pop()


def check_backward(model: Encoder, transcoders: Transcoders, path: Path) -> dict[str, float]:
    """The graph against the model code on a random prompt and rows: per output, the
    largest difference over that output's largest value."""
    config = model.config
    generator = torch.Generator().manual_seed(0)
    length = min(11, config.max_seq_len)
    # rows at every layer but one (a layer without rows, as a graph's passes have them)
    counts = [0 if layer == 1 else 1 + layer % 3 for layer in range(config.n_layers + 1)]
    grads = [torch.randn(n, config.d_model, generator=generator) for n in counts]
    positions = [torch.randint(0, length, (n,), generator=generator) for n in counts]
    ids = torch.randint(0, config.vocab_size, (1, length), generator=generator)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = [t.numpy() for t in (ids, *grads, *positions)]
    got = session.run(None, dict(zip(backward_inputs(config.n_layers), feeds, strict=True)))
    with torch.no_grad():
        want = BackwardGraph(model, transcoders)(ids, grads, positions)
    fidelity = {}
    for name, g, w in zip(BACKWARD_OUTPUTS, got, want, strict=True):
        w = w.numpy()
        fidelity[name] = float(np.abs(g - w).max() / max(float(np.abs(w).max()), 1e-30))
    return fidelity
