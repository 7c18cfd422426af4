"""Writes the model directory the service serves, only after the export passed parity."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from attnserve.export import DEFAULT_TOLERANCE, FP16_TOLERANCE
from attnserve.export.fp16 import convert_to_fp16
from attnserve.export.fused import with_attention_weights
from attnserve.export.onnx_export import ONNX_OPSET, export_onnx, exporter_versions
from attnserve.export.parity import ParityCase, check_parity
from attnserve.model.artifacts import (
    EMBEDDINGS_FP16_ONNX_FILENAME,
    EMBEDDINGS_ONNX_FILENAME,
    FP16_ONNX_FILENAME,
    FUSED_ONNX_FILENAME,
    ONNX_FILENAME,
    REPORT_FILENAME,
)
from attnserve.model.encoder import Encoder


@dataclass(frozen=True)
class Graph:
    with_attentions: bool
    source: str | None = None  # the graph this one is made from; None: traced from PyTorch
    derive: Callable[[Path, Path], Path] | None = None  # (source, destination) -> destination
    fp16: bool = False  # float16 inside: checked against the float16 tolerance


GRAPHS = {  # in the order they are made
    ONNX_FILENAME: Graph(with_attentions=True),
    EMBEDDINGS_ONNX_FILENAME: Graph(with_attentions=False),
    FUSED_ONNX_FILENAME: Graph(True, EMBEDDINGS_ONNX_FILENAME, with_attention_weights),
    FP16_ONNX_FILENAME: Graph(True, ONNX_FILENAME, convert_to_fp16, fp16=True),
    EMBEDDINGS_FP16_ONNX_FILENAME: Graph(False, EMBEDDINGS_ONNX_FILENAME, convert_to_fp16, True),
}


@dataclass(frozen=True)
class ExportReport:
    model_dir: str
    onnx_bytes: dict[str, int]  # per file
    parameters: int
    tolerance: float  # the parity gate of the float32 graphs
    fp16_tolerance: float  # ... and of the float16 ones
    parity: list[ParityCase]
    export_seconds: float
    parity_seconds: float
    versions: dict[str, str] = field(default_factory=exporter_versions)


def write_model_dir(
    model: Encoder,
    out: str | Path,
    tolerance: float = DEFAULT_TOLERANCE,
    shapes: list[tuple[int, int]] | None = None,
    log: Callable[[str], None] = print,
    extra_files: dict[str, Path] | None = None,
    fp16_tolerance: float = FP16_TOLERANCE,
) -> ExportReport:
    """Export the graphs (GRAPHS), check each one's parity with PyTorch, then move the
    files into `out`.

    extra_files (name -> source) are copied in too, e.g. the tokenizer.json.

    Everything is written to a scratch directory beside `out` first, so a model
    that fails its parity check (ParityError) never reaches `out`.
    """
    out = Path(out)
    scratch = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    sizes: dict[str, int] = {}
    cases: list[ParityCase] = []
    export_seconds = parity_seconds = 0.0
    try:
        for filename, graph in GRAPHS.items():
            start = time.perf_counter()
            if graph.source is None or graph.derive is None:
                log(
                    f"exporting {filename} (ONNX opset {ONNX_OPSET}, dynamic batch and seq axes)..."
                )
                onnx_path = export_onnx(model, scratch / filename, graph.with_attentions)
            else:
                log(f"making {filename} from {graph.source} ({graph.derive.__name__})...")
                onnx_path = graph.derive(scratch / graph.source, scratch / filename)
            export_seconds += time.perf_counter() - start
            sizes[filename] = onnx_path.stat().st_size
            log(f"  checked: {sizes[filename] / 1e6:.1f} MB in {time.perf_counter() - start:.1f}s")

            start = time.perf_counter()
            gate = fp16_tolerance if graph.fp16 else tolerance
            log(f"parity of {filename}: PyTorch vs ONNX Runtime CPU, tolerance {gate:g}...")
            graph_cases = check_parity(model, onnx_path, shapes=shapes, tolerance=gate)
            parity_seconds += time.perf_counter() - start
            for case in graph_cases:
                diffs = "  ".join(f"{name} {d:.2e}" for name, d in case.max_abs_diff.items())
                log(f"  batch={case.batch:<2} seq_len={case.seq_len:<5} max abs diff {diffs}")
            cases += graph_cases

        report = ExportReport(
            model_dir=str(out),
            onnx_bytes=sizes,
            parameters=sum(p.numel() for p in model.parameters()),
            tolerance=tolerance,
            fp16_tolerance=fp16_tolerance,
            parity=cases,
            export_seconds=round(export_seconds, 3),
            parity_seconds=round(parity_seconds, 3),
        )
        (scratch / REPORT_FILENAME).write_text(json.dumps(asdict(report), indent=2) + "\n")
        for name, source in (extra_files or {}).items():
            shutil.copyfile(source, scratch / name)
        out.mkdir(parents=True, exist_ok=True)
        for item in scratch.iterdir():
            os.replace(item, out / item.name)
        log(f"wrote {out}: {', '.join(sizes)} ({report.parameters:,} parameters)")
        return report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
