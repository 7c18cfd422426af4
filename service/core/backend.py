"""The seam between the batcher and whatever runs the model.

The batcher and the transports see only this protocol and its value types, which import
no engine; `OrtRuntime` (service/ort/runtime.py) implements it with ONNX Runtime sessions, and
the batcher's tests implement it with a few lines of numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from attnserve.model.config import ModelConfig


@dataclass(frozen=True)
class AttentionSelection:
    """One input's attention request, validated: indices are in range and absolute."""

    layers: tuple[int, ...]  # ascending when rollout
    heads: tuple[int, ...]
    rows: tuple[int, ...] | None = None  # absolute query positions; None: every row
    reduction: str = "none"  # over heads: "none", "mean", "max" (rollout: never "none")
    rollout: bool = False
    top_k: int = 0  # 0: off
    entropy: bool = False
    weights: bool = True  # False: only the summaries (entropy, top-k indices)
    float16: bool = False
    packed: bool = False  # causal-packed layout (every row, no top_k)


@dataclass(frozen=True)
class AttentionOutput:
    """What one input's result carries besides embeddings, in wire dtypes."""

    rows: np.ndarray  # (R,) the absolute query positions of the rows axis
    weights: np.ndarray | None  # (L', H', R, T | k) or packed (L', H', T (T + 1) / 2)
    indices: np.ndarray | None  # int32, weights' shape: key positions of the top-k
    entropy: np.ndarray | None  # float32 (L', H')


@dataclass(frozen=True)
class LensOutput:
    """The logit lens of some residual rows (N of them): what the model would predict if
    each row were its last layer's."""

    logits: np.ndarray  # float32 (N, V)
    top_ids: np.ndarray  # int64 (N, k), most probable first
    top_probabilities: np.ndarray  # float32 (N, k)
    target_probabilities: np.ndarray  # float32 (N, n): of the target ids asked for


@dataclass(frozen=True)
class WeightsInfo:
    """What GetModelInfo says of a model's weights (the server fills it from the backend)."""

    disk_bytes: int = 0  # the served precision's weights on disk
    resident_bytes: int = 0  # what the model's sessions hold of them in memory
    # against PyTorch float32, measured by the export's parity check (export_report.json)
    attention_max_abs_diff: float = 0.0
    embedding_cosine_min: float = 1.0


class Backend(Protocol):
    """Runs batches of right-padded token ids. Inputs are already validated (the transports
    check every id and length once, per request), so a backend never refuses an id."""

    @property
    def config(self) -> ModelConfig:
        """The served model's config (the one source of truth: read back from the model)."""

    @property
    def version(self) -> str:
        """Identifies the served weights; two different models never share it."""

    @property
    def provider(self) -> str:
        """Where the model runs: "cpu" or "cuda"."""

    @property
    def precision(self) -> str:
        """ "fp32" or "fp16" (what is computed inside; inputs and outputs stay float32)."""

    def attend(
        self, input_ids: np.ndarray, lengths: list[int], selections: list[AttentionSelection]
    ) -> tuple[np.ndarray, list[AttentionOutput]]:
        """int64 (B, T), right-padded -> embeddings float32 (B, T, D) and, per row, the
        attention its selection asks for (the full T x T weights stay inside)."""

    def embed(self, input_ids: np.ndarray) -> np.ndarray:
        """int64 (B, T) -> embeddings float32 (B, T, D), on the fastest path there is."""

    def release_memory(self) -> None:
        """Give memory freed since the last batch back to the OS (called when idle)."""

    def warmup(self) -> None:
        """Run a few shapes once so that first requests skip allocation and setup."""
