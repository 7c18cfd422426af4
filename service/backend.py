"""The seam between the batcher and whatever runs the model.

The batcher and the transports see only this protocol; `OrtRuntime`
(service/runtime.py) implements it with ONNX Runtime sessions, and the batcher's
tests implement it with a few lines of numpy.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.service.attention import AttentionOutput, AttentionSelection


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
