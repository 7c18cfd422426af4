"""`attnserve sae add`: a sparse autoencoder (SAELens', Gemma Scope's or Llama Scope's),
checked against a model directory and written beside it as an ONNX graph (model/sae.py
traced) in `MODEL_DIR/saes/NAME/`: sae.onnx, sae.data (its weights) and sae.json (its config and
what the parity check measured).

The graph: `x` (B, T, d_in) the hook site's values, `top_k` int64 [1] and
`with_error_norm` bool [] in; `top_ids` int64 and `top_activations` (B, T,
k) (descending; -1 and 0 where fewer are active), `l0` int64 and `error_norm` (B, T)
(zeros, and the decoder unread, with with_error_norm false), and `activations` (B, T,
d_sae) out.

The formats an SAE is read from: export/sae_sources.py.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import torch

from attnserve.export.int8 import convert_to_int8
from attnserve.export.onnx_export import ONNX_OPSET, quiet_exporter
from attnserve.export.onnx_files import save_checked
from attnserve.export.read_back import read_config
from attnserve.export.sae_site import norm_sites, write_site
from attnserve.export.sae_sources import SAEError, read_sae
from attnserve.export.scratch import scratch_beside
from attnserve.export.weights import WeightsFile, externalize
from attnserve.model.artifacts import (
    SAE_INPUTS,
    SAE_JSON,
    SAE_ONNX,
    SAE_OUTPUTS,
    SAE_WEIGHTS,
    SAES_DIRNAME,
    TRANSCODER_TARGET,
    ModelDirectory,
    graph_file,
)
from attnserve.model.config import ModelConfig
from attnserve.model.hooks import RESID_POST, hook_names, site_width
from attnserve.model.norms import NormSite
from attnserve.model.readout_sites import normed_site, readout_sites, stream_site
from attnserve.model.sae import SparseAutoencoder
from attnserve.model.sae_config import SAEConfig

NAME_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")  # a folder of saes/, no more
# The parity gate: ONNX Runtime against PyTorch, each difference over that position's
# largest activation (or its input's norm, for the error's norm).
SAE_TOLERANCE = 1e-4
# An SAE's matrices in 8 bits (int8 arithmetic, blocks of 32: export/int8.py) land within
# this of float32's (docs/model.md states what was measured).
INT8_TOLERANCE = 0.05
SAE_PRECISIONS = ("fp32", "int8")
TOLERANCES = dict(zip(SAE_PRECISIONS, (SAE_TOLERANCE, INT8_TOLERANCE), strict=True))
SAE_INT8_WEIGHTS = "sae_int8.data"
# The check's inputs: residual-stream-like rows of this scale with a few outlier
# dimensions of OUTLIER_SCALE, as trained models' run (docs/model.md).
CHECK_SCALE, OUTLIER_SCALE = 10.0, 3000.0


def served_model(model_dir: Path) -> tuple[ModelConfig, set[str]]:
    """The config of the model a directory serves (from its graph's metadata), and the
    outputs of its readouts graph (model/readout_sites.py; none without one)."""
    directory = ModelDirectory(model_dir)
    if not directory.precisions:
        raise SAEError(f"{model_dir} is not a model directory: no model graph")
    readouts = directory.path / graph_file("readouts", directory.precisions[0])
    returned = set()
    if readouts.is_file():
        outputs = onnx.load(str(readouts), load_external_data=False).graph.output
        returned = {output.name for output in outputs}
    return read_config(model_dir), returned


def check_against(sae: SAEConfig, config: ModelConfig, returned: set[str]) -> None:
    """Refuse an SAE whose site this model lacks, whose d_in is not the site's width, or
    whose site the directory's readouts graph (its outputs `returned`) does not return; a
    transcoder's output site likewise (d_out its width)."""
    _check_site("hook_name", sae.hook_name, "d_in", sae.d_in, config, returned, normed=True)
    if sae.transcoder:
        _check_site("hook_name_out", sae.hook_name_out, "d_out", sae.width_out, config, returned)


def _check_site(
    field: str,
    hook: str,
    width_field: str,
    width: int,
    config: ModelConfig,
    returned: set[str],
    normed: bool = False,
) -> None:
    """`normed`: also a site a norm computes from one the readouts graph returns."""
    if hook not in hook_names(config):
        last = RESID_POST.format(layer=config.n_layers - 1)
        raise SAEError(
            f"{field} {hook!r} is not a site of this model (layers 0-"
            f"{config.n_layers - 1}; e.g. {last!r})"
        )
    served_width = site_width(config, hook)
    if served_width is None:
        raise SAEError(f"{field} {hook!r}: an SAE cannot read attention patterns")
    norm = normed_site(config, hook) if normed else None
    site = stream_site(config, hook if norm is None else norm.source)
    if site is None or site[0] not in returned:
        served = {  # each site's name without its layer: blocks.0.attn.hook_z -> attn.hook_z
            name.split(".", 2)[-1]
            for output, names in readout_sites(config).items()
            if output in returned
            for name in names
        }
        if normed:  # and those a norm computes from them
            served |= {
                n.split(".", 2)[-1] if n.startswith("blocks.") else n
                for n in hook_names(config)
                if normed_site(config, n)
            }
        raise SAEError(
            f"{field} {hook!r}: this model directory's readouts graph does not "
            f"return this site; SAEs are served on {', '.join(sorted(served)) or 'none'}"
        )
    if width != served_width:
        raise SAEError(f"{width_field} is {width}, but {hook} is {served_width} wide in this model")


def add_sae(
    model_dir: str | Path,
    source: str | Path,
    name: str | None = None,
    hook: str | None = None,
    log: Callable[[str], None] = print,
    precision: str = "fp32",
) -> Path:
    """Check the SAE at `source` (export/sae_sources.py) against the model in `model_dir`
    and write its graph into model_dir/saes/NAME (NAME: the source's folder's name), its
    matrices in 8 bits with precision "int8" (export/int8.py, as a model's); nothing is
    written if a check fails."""
    model_dir, source = Path(model_dir), Path(source)
    config, weights = read_sae(source, hook)
    model, returned = served_model(model_dir)
    check_against(config, model, returned)
    site = norm_sites(model_dir, model, [config.hook_name]).get(config.hook_name)
    name = name or (source.parent.name if source.is_file() else source.name)
    return write_sae(model_dir, source, config, weights, name, log, precision, site)


def write_sae(
    model_dir: Path,
    source: Path,
    config: SAEConfig,
    weights: dict[str, torch.Tensor],
    name: str,
    log: Callable[[str], None],
    precision: str,
    site: NormSite | None = None,
) -> Path:
    """One checked SAE's graph into model_dir/saes/NAME, and `site`'s (export/sae_site.py)
    where a norm computes the site it reads."""
    if precision not in SAE_PRECISIONS:
        raise SAEError(f"precision {precision!r} is not one of {SAE_PRECISIONS}")
    if not NAME_PATTERN.fullmatch(name):
        raise SAEError(f"name {name!r}: letters, digits, '.', '_' and '-', not first '.'")
    out = model_dir / SAES_DIRNAME / name
    if out.exists():
        raise SAEError(f"{out} exists: choose another --name")
    sae = SparseAutoencoder(config)
    expected = {k for k, _ in sae.named_parameters()}
    if not expected <= set(weights):
        raise SAEError(f"{source}: the weights lack {sorted(expected - set(weights))}")
    sae.load_state_dict({k: weights[k] for k in expected})
    kind = "transcoder" if config.transcoder else "SAE"
    with scratch_beside(out) as scratch:
        log(f"tracing the {config.architecture} {kind} ({config.d_in} -> {config.d_sae})...")
        graph = export_sae(sae, scratch)
        if precision == "int8":  # beside the float32 graph (its weights are read from there)
            log("its matrices into 8 bits...")
            eight_bits = scratch / f"int8_{SAE_ONNX}"
            with WeightsFile(scratch / SAE_INT8_WEIGHTS) as packed:
                convert_to_int8(graph, eight_bits, packed)
            (scratch / SAE_WEIGHTS).unlink()
            eight_bits.replace(graph)
        decoder_on_demand(scratch / SAE_ONNX)
        log("checking: PyTorch vs ONNX Runtime CPU...")
        fidelity = check_sae(sae, scratch / SAE_ONNX, TOLERANCES[precision])
        if site is not None:
            log(f"tracing the norm that computes {config.hook_name}...")
            fidelity["site"] = write_site(site, scratch)
        info = {"config": config.to_dict(), "source": str(source), "precision": precision}
        info["fidelity"] = fidelity
        (scratch / SAE_JSON).write_text(json.dumps(info, indent=2) + "\n")
        scratch.rename(out)
    sites = config.hook_name + (f" -> {config.hook_name_out}" if config.transcoder else "")
    log(
        f"wrote {out}: {config.architecture}, {config.d_sae} features on {sites} "
        f"({precision}; the largest difference from PyTorch over each position's largest "
        f"activation: {fidelity['activations']:.2g})"
    )
    return out


def list_saes(model_dir: str | Path) -> list[dict]:
    """Each SAE a model directory holds: its name and sae.json."""
    root = Path(model_dir) / SAES_DIRNAME
    found = sorted(root.glob(f"*/{SAE_JSON}")) if root.is_dir() else []
    return [{"name": path.parent.name, **json.loads(path.read_text())} for path in found]


def export_sae(sae: SparseAutoencoder, out: Path) -> Path:
    """Trace `sae` to out/sae.onnx, its weights in out/sae.data, with `top_k` an input."""
    out.mkdir(parents=True, exist_ok=True)
    batch, seq = torch.export.Dim("batch", min=1), torch.export.Dim("seq", min=1)
    examples: tuple[torch.Tensor, ...] = (torch.zeros(2, 3, sae.config.d_in),)
    names = [SAE_INPUTS[0]]
    if sae.config.transcoder:  # the output site's values, for the error
        examples += (torch.zeros(2, 3, sae.config.width_out),)
        names.append(TRANSCODER_TARGET)
    dims = {0: batch, 1: seq}
    quiet_exporter()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        program = torch.onnx.export(
            sae.eval(),
            examples,
            dynamo=True,
            dynamic_shapes={"x": dims, "target": dims} if sae.config.transcoder else {"x": dims},
            input_names=names,
            output_names=["l0", "error_norm", "activations"],
            opset_version=ONNX_OPSET,
            verbose=False,
        )
    assert program is not None
    graph = program.model
    _with_top_features(graph)
    with WeightsFile(out / SAE_WEIGHTS) as weights:
        externalize(graph, weights)
    return save_checked(ir.to_proto(graph), out / SAE_ONNX)


def _with_top_features(model: ir.Model) -> None:
    """The k strongest activations per position and their ids (k an input), -1 and 0 past
    the active ones, ahead of the other outputs."""
    graph = model.graph
    activations = graph.outputs[-1]
    int64 = ir.TensorType(ir.DataType.INT64)
    k = ir.Value(name=SAE_INPUTS[1], shape=ir.Shape([1]), type=int64)
    graph.inputs.append(k)
    zero, none = (ir.Value(name=n) for n in ("zero", "no_feature"))
    zero.const_value = ir.tensor(np.array(0.0, np.float32), name="zero")
    none.const_value = ir.tensor(np.array(-1, np.int64), name="no_feature")
    for value in (zero, none):
        graph.register_initializer(value)
    top = ir.node("TopK", [activations, k], attributes={"axis": -1}, num_outputs=2)
    values, ids = top.outputs
    active = ir.node("Greater", [values, zero])
    top_ids = ir.node("Where", [active.outputs[0], ids, none])
    top_acts = ir.node("Where", [active.outputs[0], values, zero])
    graph.extend([top, active, top_ids, top_acts])
    float32 = ir.TensorType(ir.DataType.FLOAT)
    for node, dtype, name in ((top_ids, int64, "top_ids"), (top_acts, float32, "top_activations")):
        output = node.outputs[0]
        output.name, output.type, output.shape = name, dtype, ir.Shape(["batch", "seq", "k"])
    graph.outputs[:] = [top_ids.outputs[0], top_acts.outputs[0], *graph.outputs]


def decoder_on_demand(path: Path) -> None:
    """Rewrite the graph at `path` so that the nodes only `error_norm` needs (the decoder's:
    the reconstruction and its difference from x) run inside an If on the bool input
    `with_error_norm`: false leaves the decoder's weights unread and error_norm zeros."""
    model = ir.from_proto(onnx.load(str(path), load_external_data=False))
    graph = model.graph
    error = next(v for v in graph.outputs if v.name == SAE_OUTPUTS[3])
    others = [v for v in graph.outputs if v is not error]
    decoder = _ancestors([error]) - _ancestors(others)
    nodes = [node for node in graph if node in decoder]  # in the graph's order
    flag = ir.Value(name=SAE_INPUTS[2], shape=ir.Shape([]), type=ir.TensorType(ir.DataType.BOOL))
    graph.inputs.append(flag)
    shape = ir.node("Shape", [graph.inputs[0]], attributes={"end": 2})  # (B, T)
    fill = ir.tensor(np.zeros(1, np.float32))
    zeros = ir.node("ConstantOfShape", [shape.outputs[0]], attributes={"value": fill})
    shape.outputs[0].name, zeros.outputs[0].name = "batch_and_seq", "no_error_norm"
    skip = ir.Graph([], [zeros.outputs[0]], nodes=[shape, zeros], name="skip_decoder")
    index = graph.outputs.index(error)
    graph.outputs.pop(index)  # to be the decoder's output
    graph.remove(nodes)
    decode = ir.Graph([], [error], nodes=nodes, name="decoder")
    branch = ir.node("If", [flag], attributes={"then_branch": decode, "else_branch": skip})
    graph.append(branch)
    out = branch.outputs[0]
    graph.outputs.insert(index, out)
    out.type, out.shape = error.type, error.shape
    error.name, out.name = "decoded_error_norm", SAE_OUTPUTS[3]
    save_checked(ir.to_proto(model), path)


def _ancestors(values: list[ir.Value]) -> set[ir.Node]:
    """Every node that `values` are computed from."""
    seen: set[ir.Node] = set()
    stack = [v.producer() for v in values]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(value.producer() for value in node.inputs if value is not None)
    return seen


def check_sae(
    sae: SparseAutoencoder, path: Path, tolerance: float = SAE_TOLERANCE, seed: int = 0
) -> dict[str, float]:
    """ONNX Runtime's outputs against PyTorch's on rows with outlier dimensions; raises
    SAEError past `tolerance`. Returns the largest scaled difference per output."""
    generator = torch.Generator().manual_seed(seed)
    x = CHECK_SCALE * torch.randn(2, 7, sae.config.d_in, generator=generator)
    x[..., :: max(1, sae.config.d_in // 4)] *= OUTLIER_SCALE / CHECK_SCALE
    target = None
    if sae.config.transcoder:
        target = CHECK_SCALE * torch.randn(2, 7, sae.config.width_out, generator=generator)
    k = min(16, sae.config.d_sae)
    with torch.no_grad():
        l0, error_norm, acts = (t.numpy() for t in sae(x, target))
        distance = sae.distance_to_switch(x).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = dict(zip(SAE_INPUTS, (x.numpy(), np.array([k]), np.array(True)), strict=True))
    if target is not None:
        feeds[TRANSCODER_TARGET] = target.numpy()
    got = dict(zip(SAE_OUTPUTS, session.run(None, feeds), strict=True))
    # without the decoder: the same features, no error norm
    without = session.run(None, feeds | {SAE_INPUTS[2]: np.array(False)})
    encoded = dict(zip(SAE_OUTPUTS, without, strict=True))
    if not (encoded["error_norm"] == 0).all() or any(
        not np.array_equal(encoded[name], got[name]) for name in SAE_OUTPUTS[:3] + SAE_OUTPUTS[4:]
    ):
        raise SAEError("the graph's features differ without its decoder")
    against = (x if target is None else target).numpy()  # what the error is measured to
    # an error norm is as precise as the larger of what it subtracts: the site's norm, or
    # the reconstruction's where the check's outlier dimensions make it the larger (a
    # transcoder's skip scaled to the model's own, smaller, values on those dimensions)
    error_scale = np.maximum(np.linalg.norm(against, axis=-1), error_norm)
    scale = np.maximum(np.abs(acts).max(-1), 1.0)  # (B, T): each position's largest
    # Features a rounding away from switching may switch either way: left out, and the
    # positions holding one from the top k's comparison.
    near = distance <= tolerance * scale[..., None]  # (B, T, S)
    clear = ~near.any(-1)  # (B, T)
    top = -np.sort(-acts, axis=-1)[..., :k]  # (B, T, k) descending
    top_diff = np.abs(got["top_activations"] - np.where(top > 0, top, 0)).max(-1) / scale
    act_diff = np.where(near, 0, np.abs(got["activations"] - acts)).max(-1) / scale
    diffs = {
        "top_activations": float(np.where(clear, top_diff, 0).max()),
        "activations": float(act_diff.max()),
        "l0": float(np.maximum(np.abs(got["l0"] - l0) - near.sum(-1), 0).max()),
        "error_norm": float((np.abs(got["error_norm"] - error_norm) / error_scale).max()),
    }
    failed = {name: d for name, d in diffs.items() if d > tolerance}
    if failed:
        raise SAEError(f"ONNX Runtime disagrees with PyTorch past {tolerance:g}: {failed}")
    return diffs
