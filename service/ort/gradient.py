"""The gradient graphs of a model directory (export/gradient.py), one per prompt length, each
opened when first asked for: the gradient of logit(target) - logit(contrast) at every
changeable site and at the token embeddings, for an input padded on the right to its graph."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from attnserve.model.artifacts import (
    GRADIENT_INPUTS,
    ModelDirectory,
    gradient_files,
    gradient_outputs,
)
from attnserve.model.config import ModelConfig

OpenSession = Callable[[Path, ort.SessionOptions], ort.InferenceSession]


class GradientGraphs:
    """A directory's gradient graphs by length, each session opened on first use."""

    def __init__(
        self,
        model_dir: ModelDirectory,
        config: ModelConfig,
        open_session: OpenSession,
        session_options: Callable[[], ort.SessionOptions],
    ) -> None:
        self.model_dir, self.config = model_dir, config
        self._open, self._options = open_session, session_options
        self.lengths = tuple(model_dir.gradient_lengths())
        self._sessions: dict[int, ort.InferenceSession] = {}

    def run(
        self, ids: np.ndarray, length: int, target: int, contrast: int
    ) -> dict[str, np.ndarray]:
        """The outputs (model/artifacts.py gradient_outputs) for `ids` (T,) int64 through the
        graph of `length` >= T, the difference read after its last token; every
        per-position output cut back to the T real positions."""
        if length not in self._sessions:
            path = self.model_dir.path / gradient_files(length)[0]
            so = self._options()
            # Unpacked, it reads the weights where weights.data is mapped: GPT-2 small's
            # graph of 20 tokens peaks at 604 MiB; prepacked, a copy of every matrix makes
            # it 1,224, for a graph run once a request (research/gradient-memory)
            so.add_session_config_entry("session.disable_prepacking", "1")
            self._sessions[length] = self._open(path, so)
        T = len(ids)
        padded = np.zeros((1, length), dtype=np.int64)  # causal: nothing at T - 1 sees it
        padded[0, :T] = ids
        feeds = (padded, *(np.array([x], dtype=np.int64) for x in (T - 1, target, contrast)))
        got = self._sessions[length].run(None, dict(zip(GRADIENT_INPUTS, feeds, strict=True)))
        outputs = dict(zip(gradient_outputs(self.config), got, strict=True))
        cut = {name: value[..., :T, :] for name, value in outputs.items() if name != "metric"}
        return {"metric": outputs["metric"], **cut}
