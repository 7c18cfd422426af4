"""The parity gate each graph of a model directory passes before the directory is written
(export/model_dir.py), and what the export report records of it (fidelity)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from attnserve.export import INT8_MIN_COSINE, INT8_TOLERANCE, LOGITS_TOLERANCE
from attnserve.export.parity import ParityCase, ParityError, Reference, compare
from attnserve.model.artifacts import GRAPHS
from attnserve.model.config import ModelConfig

if TYPE_CHECKING:
    from attnserve.export.model_dir import PlannedGraph


class Gates:
    """The parity gate of each graph: (tolerance, the smallest embedding cosine or None, the
    outputs gated: None for all). A lower precision's readouts are what it costs them:
    recorded (output_fidelity), gated where the served graphs are (embeddings, attention)."""

    def __init__(self, config: ModelConfig, tolerance: float, fp16_tolerance: float) -> None:
        self.config, self.tolerance, self.fp16_tolerance = config, tolerance, fp16_tolerance
        self.served = frozenset({config.embeddings_name, config.attentions_name})

    def __call__(self, graph: PlannedGraph) -> tuple[float, float | None, frozenset[str] | None]:
        row = GRAPHS[graph.kind]
        if graph.precision == "fp32":
            return (LOGITS_TOLERANCE if row.logits else self.tolerance), None, None
        gated = self.served if row.on_demand else None
        if graph.precision == "fp16":
            return self.fp16_tolerance, None, gated
        return INT8_TOLERANCE, INT8_MIN_COSINE, gated


def check_graphs(
    scratch: Path,
    graphs: list[PlannedGraph],
    gates: Gates,
    references: list[Reference],
    log: Callable[[str], None],
    int8_arithmetic: str,
) -> list[ParityCase]:
    """Each graph against PyTorch's `references` under its gate (ParityError past it)."""
    cases: list[ParityCase] = []
    longest = max(r.shape[1] for r in references)
    for graph in graphs:
        limit, min_cosine, gated = gates(graph)
        floor = "" if min_cosine is None else f", embedding cosine >= {min_cosine}"
        if gated is not None:
            floor += "; the readouts recorded, not gated"
        log(
            f"checking {graph.filename}: PyTorch vs ONNX Runtime CPU, tolerance {limit:g} (of "
            f"each row's scale where it passes 1; probabilities absolute){floor}..."
        )
        checked = references
        if graph.kind == "readouts":  # model.onnx's own trace: not the longest
            checked = [r for r in references if r.shape[1] < longest] or references
        int8 = graph.precision == "int8"
        try:
            graph_cases = compare(
                checked, scratch / graph.filename, gates.config, limit, min_cosine, gated,
                prepacked=int8,  # checked as served: see compare
            )  # fmt: skip
        except ParityError as exc:
            if not int8 or int8_arithmetic != "int8":
                raise
            raise ParityError(
                f"{exc} (8-bit weights times int8 activations; `--int8-arithmetic "
                "float32` comes closer to float32, and is slower)"
            ) from exc
        for case in graph_cases:  # what the gate judged (parity.scaled_diff)
            diffs = "  ".join(f"{name} {d:.2e}" for name, d in case.scaled_diff.items())
            if min_cosine is not None:
                diffs += f"  embedding cosine {case.embedding_cosine:.5f}"
            log(f"  batch={case.batch:<2} seq_len={case.seq_len:<5} {diffs}")
        cases += graph_cases
    return cases


def fidelity(cases: list[ParityCase], attentions: str) -> dict[str, dict[str, float]]:
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


def output_fidelity(cases: list[ParityCase]) -> dict[str, dict[str, float]]:
    """Per graph, per output: the largest difference its gate judged over the cases."""
    worst: dict[str, dict[str, float]] = {}
    for case in cases:
        graph = worst.setdefault(case.graph, {})
        for output, value in case.scaled_diff.items():
            graph[output] = max(graph.get(output, 0.0), value)
    return worst
