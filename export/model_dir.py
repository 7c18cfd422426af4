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

import torch

from attnserve.export import (
    DEFAULT_TOLERANCE,
    FP16_TOLERANCE,
    INT8_MIN_COSINE,
    INT8_TOLERANCE,
    LOGITS_TOLERANCE,
)
from attnserve.export.fp16 import convert_to_fp16
from attnserve.export.fused import with_attention_weights
from attnserve.export.int8 import convert_to_int8, is_matrix
from attnserve.export.onnx_export import ONNX_OPSET, export_onnx, exporter_versions
from attnserve.export.parity import (
    ParityCase,
    ParityError,
    compare,
    default_shapes,
    reference_outputs,
)
from attnserve.export.scratch import scratch_beside
from attnserve.export.trace_ahead import tracer
from attnserve.export.weights import WeightsFile
from attnserve.model.artifacts import (
    ATTRIBUTION_ONNX_FILENAME,
    DECODE_ONNX_FILENAME,
    EMBEDDINGS_FP16_ONNX_FILENAME,
    EMBEDDINGS_INT8_ONNX_FILENAME,
    EMBEDDINGS_ONNX_FILENAME,
    FP16_ONNX_FILENAME,
    FUSED_ONNX_FILENAME,
    INT8_ONNX_FILENAME,
    LENS_ONNX_FILENAME,
    ONNX_FILENAME,
    PRECISIONS,
    QUERIES_ONNX_FILENAME,
    READOUT_GRAPHS,
    READOUTS_ONNX_FILENAME,
    REPORT_FILENAME,
    WEIGHTS_FILENAMES,
    readout_filename,
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


def traced_graphs(config: ModelConfig, precisions: tuple[str, ...]) -> list[tuple[str, str]]:
    """The float32 graphs an export of `precisions` traces, (file name, kind), in order; the
    one place that decides which are written. The traced full graph serves fp32 on every
    provider and is fp16's source; its trace with the readouts is every precision's readouts
    graph's source. The fused one, made from the embeddings graph, is what int8 is made
    from (the traced one where the fused kernel cannot compute the attention: Gemma 2). The
    lens and attribution graphs, where the model has them, are every precision's source of
    its own (DERIVED)."""
    traced = [(ONNX_FILENAME, "full"), (EMBEDDINGS_ONNX_FILENAME, "embeddings")]
    traced.append((QUERIES_ONNX_FILENAME, "queries"))
    if config.unembedding != "none":
        traced.append((LENS_ONNX_FILENAME, "lens"))
        if config.attribution_refusal is None:
            traced.append((ATTRIBUTION_ONNX_FILENAME, "attribution"))
        if config.max_seq_len >= 2:  # a prompt and one token to generate after it
            traced.append((DECODE_ONNX_FILENAME, "decode"))
    return traced


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
    trace_ahead: trace the graphs after the first in a child process meanwhile (None: for
    deep models on two cores or more; export/trace_ahead.py).
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
    with scratch_beside(out) as scratch:
        start = time.perf_counter()
        progress = _progress(log, parameters * 4)
        # The parameters themselves, not state_dict's detached views: _release frees their
        # storage through them, whoever keeps a reference.
        tensors = dict(model.named_parameters())
        with WeightsFile(scratch / WEIGHTS_FILENAMES["fp32"], progress) as weights:
            traced = traced_graphs(config, precisions)
            # the readouts are the full graph's trace before it loses them
            readouts = scratch / READOUTS_ONNX_FILENAME
            with tracer(config, [kind for _, kind in traced], trace_ahead) as traced_graph:
                for filename, kind in traced:
                    log(f"tracing {filename} (ONNX opset {ONNX_OPSET}, dynamic axes)...")
                    graph = traced_graph(kind)
                    export_onnx(config, tensors, scratch / filename, weights, kind, readouts, graph)
        del tensors
        if release_weights:  # the one float32 copy goes before ONNX Runtime maps the file
            _release(model)
        fp32_graphs = [name for name, _ in traced]
        if (scratch / READOUTS_ONNX_FILENAME).is_file():
            fp32_graphs.append(READOUTS_ONNX_FILENAME)
        if config.fuses_attention:
            fp32_graphs.append(FUSED_ONNX_FILENAME)
            log(f"writing {FUSED_ONNX_FILENAME} from {EMBEDDINGS_ONNX_FILENAME}...")
            with_attention_weights(
                scratch / EMBEDDINGS_ONNX_FILENAME, scratch / FUSED_ONNX_FILENAME
            )
        # graph -> (tolerance, smallest embedding cosine, the outputs gated: None for all)
        gates: dict[str, tuple[float, float | None, frozenset[str] | None]] = dict.fromkeys(
            fp32_graphs, (tolerance, None, None)
        )
        for name in (LENS_ONNX_FILENAME, ATTRIBUTION_ONNX_FILENAME, DECODE_ONNX_FILENAME):
            if name in gates:  # logits are dot products over d_model: 10x the room
                gates[name] = (LOGITS_TOLERANCE, None, None)
        # A lower precision's readouts are what it costs them: recorded (output_fidelity),
        # gated where the served graphs are (the embeddings and the attention).
        served = frozenset({config.embeddings_name, config.attentions_name})
        int8_graphs: set[str] = set()  # checked with their weights prepacked, as served
        int8 = partial(convert_to_int8, arithmetic=int8_arithmetic)
        for precision in [p for p in precisions if p in DERIVED]:
            limit, cosine = (
                (fp16_tolerance, None) if precision == "fp16" else (INT8_TOLERANCE, INT8_MIN_COSINE)
            )
            recorded = {readout_filename(name, precision) for name in READOUT_GRAPHS}
            for name in _derive(scratch, precision, log, int8 if precision == "int8" else None):
                gates[name] = (limit, cosine, served if name in recorded else None)
                if precision == "int8":
                    int8_graphs.add(name)
        if "fp32" not in precisions:  # made only as the others' source
            for name in fp32_graphs:
                (scratch / name).unlink()
                del gates[name]
            (scratch / WEIGHTS_FILENAMES["fp32"]).unlink()
        export_seconds = time.perf_counter() - start

        cases: list[ParityCase] = []
        longest = max(seq_len for _, seq_len in shapes)
        for filename, (limit, min_cosine, gated) in gates.items():
            start = time.perf_counter()
            floor = "" if min_cosine is None else f", embedding cosine >= {min_cosine}"
            if gated is not None:
                floor += "; the readouts recorded, not gated"
            log(
                f"checking {filename}: PyTorch vs ONNX Runtime CPU, tolerance {limit:g} (of each "
                f"row's scale where it passes 1; probabilities absolute){floor}..."
            )
            checked = references
            if filename in READOUTS_FILENAMES:  # model.onnx's own trace: not the longest
                checked = [r for r in references if r.shape[1] < longest] or references
            try:
                graph_cases = compare(
                    checked, scratch / filename, config, limit, min_cosine, gated,
                    prepacked=filename in int8_graphs,  # checked as served: see compare
                )  # fmt: skip
            except ParityError as exc:
                if filename not in int8_graphs or int8_arithmetic != "int8":
                    raise
                raise ParityError(
                    f"{exc} (8-bit weights times int8 activations; `--int8-arithmetic "
                    "float32` comes closer to float32, and is slower)"
                ) from exc
            parity_seconds += time.perf_counter() - start
            for case in graph_cases:  # what the gate judged (parity.scaled_diff)
                diffs = "  ".join(f"{name} {d:.2e}" for name, d in case.scaled_diff.items())
                if min_cosine is not None:
                    diffs += f"  embedding cosine {case.embedding_cosine:.5f}"
                log(f"  batch={case.batch:<2} seq_len={case.seq_len:<5} {diffs}")
            cases += graph_cases

        report = ExportReport(
            model_dir=str(out),
            onnx_bytes={f.name: f.stat().st_size for f in sorted(scratch.iterdir())},
            parameters=parameters,
            tolerance=tolerance,
            fp16_tolerance=fp16_tolerance,
            parity=cases,
            export_seconds=round(export_seconds, 3),
            parity_seconds=round(parity_seconds, 3),
            precisions=list(precisions),
            fidelity=_fidelity(cases, config.attentions_name),
            output_fidelity=_output_fidelity(cases),
        )
        _finish(scratch, out, report, extra_files)
    total = sum(report.onnx_bytes.values())
    log(f"wrote {out}: {total / 1e6:,.1f} MB, {', '.join(precisions)} ({parameters:,} parameters)")
    return report


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
        )
        shutil.rmtree(scratch / "prefix")
        traced = traced_graphs(config, ("int8",))
        readouts = scratch / READOUTS_ONNX_FILENAME
        with WeightsFile(scratch / WEIGHTS_FILENAMES["fp32"], leave_out=is_matrix) as float32:
            for filename, kind in traced:
                log(f"tracing {filename}...")
                export_onnx(config, tensors, scratch / filename, float32, kind, readouts)
        sources = [name for name, _ in traced] + [READOUTS_ONNX_FILENAME]
        if config.fuses_attention:
            sources.append(FUSED_ONNX_FILENAME)
            with_attention_weights(
                scratch / EMBEDDINGS_ONNX_FILENAME, scratch / FUSED_ONNX_FILENAME
            )
        int8 = partial(convert_to_int8, unwritten=float32.unwritten, arithmetic=int8_arithmetic)
        _derive(scratch, "int8", log, int8, _progress(log, weight_bytes(config) // 3))
        for name in (*sources, WEIGHTS_FILENAMES["fp32"]):
            (scratch / name).unlink()
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


# The graphs made from the float32 ones: precision -> (its converter, the (float32 source,
# graph) pairs it makes)
DERIVED: dict[
    str, tuple[Callable[[Path, Path, WeightsFile], object], tuple[tuple[str, str], ...]]
] = {
    "fp16": (
        convert_to_fp16,
        (
            (ONNX_FILENAME, FP16_ONNX_FILENAME),
            (EMBEDDINGS_ONNX_FILENAME, EMBEDDINGS_FP16_ONNX_FILENAME),
        ),
    ),
    "int8": (
        convert_to_int8,
        (
            (FUSED_ONNX_FILENAME, INT8_ONNX_FILENAME),
            (EMBEDDINGS_ONNX_FILENAME, EMBEDDINGS_INT8_ONNX_FILENAME),
        ),
    ),
}
# ... and each precision's readouts graphs (READOUT_GRAPHS), from the float32 ones there are
READOUTS_FILENAMES = {readout_filename(READOUTS_ONNX_FILENAME, p) for p in PRECISIONS}


def _derive(
    scratch: Path,
    precision: str,
    log: Callable[[str], None],
    convert: Callable[[Path, Path, WeightsFile], object] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """Make a precision's graphs from the float32 ones in `scratch`, into that precision's
    weights file (`convert`: instead of the precision's converter); returns their names."""
    converter, pairs = DERIVED[precision]
    convert = convert or converter
    if not (scratch / FUSED_ONNX_FILENAME).is_file():  # int8 from the traced graph instead
        pairs = tuple((ONNX_FILENAME if s == FUSED_ONNX_FILENAME else s, t) for s, t in pairs)
    pairs += tuple(
        (name, readout_filename(name, precision))
        for name in READOUT_GRAPHS
        if (scratch / name).is_file()
    )
    with WeightsFile(scratch / WEIGHTS_FILENAMES[precision], progress) as weights:
        for source, target in pairs:
            log(f"writing {target} from {source} ({precision})...")
            convert(scratch / source, scratch / target, weights)
    return [target for _, target in pairs]


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


def _fidelity(cases: list[ParityCase], attentions: str) -> dict[str, dict[str, float]]:
    """Per graph with attention: its largest attention difference and smallest embedding
    cosine against PyTorch float32, over the parity cases."""
    fidelity: dict[str, dict[str, float]] = {}
    for case in cases:
        if attentions not in case.max_abs_diff:
            continue
        worst = fidelity.setdefault(
            case.graph, {"attention_max_abs_diff": 0.0, "embedding_cosine_min": 1.0}
        )
        worst["attention_max_abs_diff"] = max(
            worst["attention_max_abs_diff"], case.max_abs_diff[attentions]
        )
        worst["embedding_cosine_min"] = min(worst["embedding_cosine_min"], case.embedding_cosine)
    return fidelity


def _output_fidelity(cases: list[ParityCase]) -> dict[str, dict[str, float]]:
    """Per graph, per output: the largest difference its gate judged over the cases."""
    worst: dict[str, dict[str, float]] = {}
    for case in cases:
        graph = worst.setdefault(case.graph, {})
        for output, value in case.scaled_diff.items():
            graph[output] = max(graph.get(output, 0.0), value)
    return worst


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
