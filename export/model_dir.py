"""Writes the model directory the service serves, only after the export passed parity.

The order keeps an import within one float32 copy of the weights plus what one layer
needs: PyTorch computes its parity outputs first; each graph is traced from the model
and its weights streamed into the one weights file they all share; the model's weights
can then be freed (`release_weights`) before ONNX Runtime opens the graphs to check them.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import onnx_ir as ir
import torch

from attnserve.export import (
    DEFAULT_TOLERANCE,
    FP16_TOLERANCE,
)
from attnserve.export.fp16 import convert_to_fp16
from attnserve.export.fused import with_attention_weights
from attnserve.export.gates import Gates, check_graphs, fidelity, output_fidelity
from attnserve.export.int8 import convert_to_int8, is_matrix
from attnserve.export.onnx_export import ONNX_OPSET, export_onnx, exporter_versions
from attnserve.export.parity import (
    ParityCase,
    default_shapes,
    reference_outputs,
)
from attnserve.export.scratch import scratch_beside
from attnserve.export.trace_ahead import tracer
from attnserve.export.weights import TRANSPOSED_SUFFIX, WeightsFile
from attnserve.model.artifacts import (
    GRAPHS,
    PRECISIONS,
    REPORT_FILENAME,
    WEIGHTS_FILENAMES,
    WEIGHTS_INDEX_FILENAME,
    graph_file,
    graph_kinds,
    graph_source,
)
from attnserve.model.config import ModelConfig
from attnserve.model.encoder import Encoder, encoder_from_weights
from attnserve.model.footprint import parameter_count, prefix_config, weight_bytes


@dataclass(frozen=True)
class ExportReport:
    model_dir: str
    onnx_bytes: dict[str, int]  # per file, the weights files included
    parameters: int
    tolerance: float  # the parity gate of the float32 graphs
    fp16_tolerance: float  # ... and of the float16 ones
    parity: list[ParityCase]
    export_seconds: float
    parity_seconds: float
    precisions: list[str] = field(default_factory=lambda: ["fp32"])  # the graphs it holds
    # per graph: the largest attention difference and the smallest embedding cosine against
    # PyTorch float32 over the parity cases (what a lower precision costs)
    fidelity: dict[str, dict[str, float]] = field(default_factory=dict)
    # per graph, per output: the largest difference the gate judged (parity.scaled_diff)
    output_fidelity: dict[str, dict[str, float]] = field(default_factory=dict)
    parity_scope: str = "the whole model"  # or a prefix, where float32 did not fit
    versions: dict[str, str] = field(default_factory=exporter_versions)


@dataclass(frozen=True)
class PlannedGraph:
    """One graph an export writes (a row of artifacts.GRAPHS in one precision)."""

    filename: str
    kind: str
    precision: str
    source: str | None  # the float32 file it is made from (None: traced from the model)


def plan_graphs(config: ModelConfig, precisions: tuple[str, ...]) -> list[PlannedGraph]:
    """The graphs an export of `precisions` writes, in order, from artifacts.GRAPHS: every
    float32 graph the model has (the others are made from them: kept only with fp32), then
    each lower precision's, converted from the float32 graph its row names (int8's full
    graph from the fused one, where there is one: Gemma 2's attention cannot fuse)."""
    kinds = graph_kinds(config)
    planned = []
    for kind in kinds:
        made_from = GRAPHS[kind].made_from
        source = None if made_from == "traced" else graph_file(made_from)
        planned.append(PlannedGraph(graph_file(kind), kind, "fp32", source))
    for precision in (p for p in PRECISIONS if p in precisions and p != "fp32"):
        for kind in (k for k in kinds if precision in GRAPHS[k].precisions):
            source = graph_source(kind, precision)
            source = graph_file(source if source in kinds else kind)
            planned.append(PlannedGraph(graph_file(kind, precision), kind, precision, source))
    return planned


def write_model_dir(
    model: Encoder,
    out: str | Path,
    tolerance: float = DEFAULT_TOLERANCE,
    shapes: list[tuple[int, int]] | None = None,
    log: Callable[[str], None] = print,
    extra_files: dict[str, Path] | None = None,
    fp16_tolerance: float = FP16_TOLERANCE,
    precisions: tuple[str, ...] = ("fp32",),
    release_weights: bool = False,
    trace_ahead: bool | None = None,
    int8_arithmetic: str = "int8",
) -> ExportReport:
    """Export the graphs of `precisions` (fp32, fp16 for CUDA, int8 for models that do not
    fit in float32), check each one's parity with PyTorch, then move the files into `out`.
    The float32 graphs are always made (the others are made from them), and kept if asked.

    extra_files (name -> source) are copied in too, e.g. the tokenizer.json.
    release_weights: free the model's weights once they are written (the model is unusable
    afterwards): ONNX Runtime then checks the graphs without a second copy beside them.
    trace_ahead: share the tracing with a child process (None: where there are three graphs
    or more, on two cores or more; export/trace_ahead.py).
    int8_arithmetic: what the int8 graphs multiply their 8-bit weights by (export/int8.py).

    Everything is written to a scratch directory beside `out` first, so a model that fails
    its parity check (ParityError) or a full disk (ExportWriteError) never reaches `out`.
    """
    if not precisions or not set(precisions) <= set(PRECISIONS):
        raise ValueError(f"precisions must be some of {PRECISIONS}, got {precisions}")
    precisions = tuple(p for p in PRECISIONS if p in precisions)
    out = Path(out)
    config = model.config
    parameters = sum(p.numel() for p in model.parameters())
    start = time.perf_counter()
    shapes = shapes or default_shapes(config)
    log(f"checking: PyTorch's outputs at (batch, seq_len) {shapes}, kept for the parity gate")
    references = reference_outputs(model, shapes)
    parity_seconds = time.perf_counter() - start
    planned = plan_graphs(config, precisions)
    with scratch_beside(out) as scratch:
        start = time.perf_counter()
        _write_graphs(model, scratch, planned, precisions, log, release_weights, trace_ahead,
                      int8_arithmetic)  # fmt: skip
        export_seconds = time.perf_counter() - start
        start = time.perf_counter()
        kept = [graph for graph in planned if graph.precision in precisions]
        gates = Gates(config, tolerance, fp16_tolerance)
        cases = check_graphs(scratch, kept, gates, references, log, int8_arithmetic)
        report = ExportReport(
            model_dir=str(out),
            onnx_bytes={f.name: f.stat().st_size for f in sorted(scratch.iterdir())},
            parameters=parameters,
            tolerance=tolerance,
            fp16_tolerance=fp16_tolerance,
            parity=cases,
            export_seconds=round(export_seconds, 3),
            parity_seconds=round(parity_seconds + time.perf_counter() - start, 3),
            precisions=list(precisions),
            fidelity=fidelity(cases, config.attentions_name),
            output_fidelity=output_fidelity(cases),
        )
        _finish(scratch, out, report, extra_files)
    total = sum(report.onnx_bytes.values())
    log(f"wrote {out}: {total / 1e6:,.1f} MB, {', '.join(precisions)} ({parameters:,} parameters)")
    return report


def _write_graphs(
    model: Encoder,
    scratch: Path,
    planned: list[PlannedGraph],
    precisions: tuple[str, ...],
    log: Callable[[str], None],
    release_weights: bool,
    trace_ahead: bool | None,
    int8_arithmetic: str,
) -> None:
    """The planned graphs into `scratch`: the float32 ones and their weights file (with its
    index), then each lower precision's made from them; float32 dropped if not asked for."""
    config = model.config
    parameters = sum(p.numel() for p in model.parameters())
    # The parameters themselves, not state_dict's detached views: _release frees their
    # storage through them, whoever keeps a reference.
    tensors = dict(model.named_parameters())
    progress = _progress(log, parameters * 4)
    with WeightsFile(scratch / WEIGHTS_FILENAMES["fp32"], progress) as weights:
        _write_float32(config, tensors, planned, scratch, weights, log, trace_ahead)
        _write_the_rest(tensors, weights, scratch / WEIGHTS_INDEX_FILENAME)
    del tensors
    if release_weights:  # the one float32 copy goes before ONNX Runtime maps the file
        _release(model)
    int8 = partial(convert_to_int8, arithmetic=int8_arithmetic)
    for precision in (p for p in precisions if p != "fp32"):
        _derive(scratch, planned, precision, log, int8 if precision == "int8" else None)
    if "fp32" not in precisions:  # made only as the others' source
        for graph in (g for g in planned if g.precision == "fp32"):
            (scratch / graph.filename).unlink()
        (scratch / WEIGHTS_FILENAMES["fp32"]).unlink()
        (scratch / WEIGHTS_INDEX_FILENAME).unlink()


def _write_float32(
    config: ModelConfig,
    tensors: Mapping[str, torch.Tensor],
    planned: list[PlannedGraph],
    scratch: Path,
    weights: WeightsFile,
    log: Callable[[str], None],
    trace_ahead: bool | None = None,
) -> None:
    """Trace the planned float32 graphs into `scratch`, their weights into `weights`, and
    make those made from them: the readouts with the full graph's trace, before it loses
    them; the fused graph from the embeddings graph."""
    float32 = [graph for graph in planned if graph.precision == "fp32"]
    traced = [graph for graph in float32 if graph.source is None]
    readouts = scratch / graph_file("readouts")
    with tracer(config, [graph.kind for graph in traced], trace_ahead) as traced_graph:
        for graph in traced:
            log(f"tracing {graph.filename} (ONNX opset {ONNX_OPSET}, dynamic axes)...")
            export_onnx(
                config, tensors, scratch / graph.filename, weights, graph.kind, readouts,
                traced_graph(graph.kind),
            )  # fmt: skip
    for graph in float32:
        if graph.kind == "fused":
            log(f"writing {graph.filename} from {graph.source}...")
            with_attention_weights(scratch / str(graph.source), scratch / graph.filename)


def _write_the_rest(tensors: Mapping[str, torch.Tensor], weights: WeightsFile, index: Path) -> None:
    """Every parameter into the weights file, the few the graphs keep inside them (norms'
    weights, small biases) too, and the file's index: the directory can then build its
    encoder again (export/read_back.py) for a graph added later, which shares the file."""
    for name, tensor in tensors.items():
        if name not in weights and f"{name}{TRANSPOSED_SUFFIX}" not in weights:
            weights.reference(ir.Tensor(tensor.detach().float().contiguous().numpy(), name=name))
    weights.write_index(index)


def write_streamed_int8(
    config: ModelConfig,
    tensors: Mapping[str, torch.Tensor],
    out: str | Path,
    log: Callable[[str], None] = print,
    extra_files: dict[str, Path] | None = None,
    int8_arithmetic: str = "int8",
) -> ExportReport:
    """An int8 directory for a model whose float32 weights do not fit in memory.

    `tensors` (the encoder's state_dict in any dtype, a checkpoint's read when looked up:
    hf_import.LazyTensors) are traced into float32 graphs whose weights file holds the
    norms and biases alone: the 8-bit weights are then made from each matrix read from
    `tensors` and widened, one at a time (and the float16 token table likewise).
    The parity gate runs on the model's first PREFIX_LAYERS layers in float32, exported and
    quantized the same way, and the report says so (`parity_scope`).
    """
    out = Path(out)
    start = time.perf_counter()
    prefix = prefix_config(config)
    outside = tuple(f"blocks.{i}." for i in range(prefix.n_layers, config.n_layers))
    with scratch_beside(out) as scratch:
        scope = f"the first {prefix.n_layers} of {config.n_layers} layers"
        log(f"checking on {scope}: float32 does not fit, the prefix does")
        prefix_model = encoder_from_weights(
            prefix, {k: tensors[k].float() for k in tensors if not k.startswith(outside)}
        )
        checked = write_model_dir(
            prefix_model,
            scratch / "prefix",
            log=log,
            precisions=("int8",),
            release_weights=True,
            int8_arithmetic=int8_arithmetic,
            trace_ahead=False,  # a child importing torch costs memory this import lacks
        )
        shutil.rmtree(scratch / "prefix")
        planned = plan_graphs(config, ("int8",))
        with WeightsFile(scratch / WEIGHTS_FILENAMES["fp32"], leave_out=is_matrix) as float32:
            _write_float32(config, tensors, planned, scratch, float32, log, trace_ahead=False)
        int8 = partial(convert_to_int8, unwritten=float32.unwritten, arithmetic=int8_arithmetic)
        progress = _progress(log, weight_bytes(config) // 3)
        _derive(scratch, planned, "int8", log, int8, progress)
        for graph in (g for g in planned if g.precision == "fp32"):
            (scratch / graph.filename).unlink()
        (scratch / WEIGHTS_FILENAMES["fp32"]).unlink()
        report = ExportReport(
            model_dir=str(out),
            onnx_bytes={f.name: f.stat().st_size for f in sorted(scratch.iterdir())},
            parameters=parameter_count(config),
            tolerance=checked.tolerance,
            fp16_tolerance=checked.fp16_tolerance,
            parity=checked.parity,
            export_seconds=round(time.perf_counter() - start, 3),
            parity_seconds=checked.parity_seconds,
            precisions=["int8"],
            fidelity=checked.fidelity,
            output_fidelity=checked.output_fidelity,
            parity_scope=scope,
        )
        _finish(scratch, out, report, extra_files)
    log(f"wrote {out}: int8, checked on {scope} ({report.parameters:,} parameters)")
    return report


# Each lower precision's converter (from a float32 graph into its weights file)
CONVERTERS: dict[str, Callable[[Path, Path, WeightsFile], object]] = {
    "fp16": convert_to_fp16,
    "int8": convert_to_int8,
}


def _derive(
    scratch: Path,
    planned: list[PlannedGraph],
    precision: str,
    log: Callable[[str], None],
    convert: Callable[[Path, Path, WeightsFile], object] | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Make a precision's planned graphs from the float32 ones in `scratch`, into that
    precision's weights file (`convert`: instead of the precision's converter)."""
    convert = convert or CONVERTERS[precision]
    with WeightsFile(scratch / WEIGHTS_FILENAMES[precision], progress) as weights:
        for graph in (g for g in planned if g.precision == precision):
            log(f"writing {graph.filename} from {graph.source} ({precision})...")
            convert(scratch / str(graph.source), scratch / graph.filename, weights)


def _finish(
    scratch: Path, out: Path, report: ExportReport, extra_files: dict[str, Path] | None
) -> None:
    """The report and the extra files into the scratch directory, then all of it into `out`."""
    (scratch / REPORT_FILENAME).write_text(json.dumps(asdict(report), indent=2) + "\n")
    for name, source in (extra_files or {}).items():
        shutil.copyfile(source, scratch / name)
    out.mkdir(parents=True, exist_ok=True)
    for item in scratch.iterdir():
        os.replace(item, out / item.name)


def _release(model: Encoder) -> None:
    """Free the storage of every weight, whoever still holds the tensor objects (the
    exporter keeps references to them past the export)."""
    for tensor in (*model.parameters(), *model.buffers()):
        tensor.data = torch.empty(0, dtype=tensor.dtype)
    gc.collect()


def _progress(log: Callable[[str], None], total: int) -> Callable[[int], None]:
    """Logs the weights written, every tenth of `total` bytes (about the float32 weights);
    silent for models that write in a blink."""
    step = total // 10 if total >= 1 << 28 else total + 1
    last = [0]

    def report(written: int) -> None:
        if written - last[0] >= step:
            last[0] = written
            log(f"  weights written: {written / 1e9:.2f} GB of about {total / 1e9:.2f} GB")

    return report
