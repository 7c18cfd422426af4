"""A transcoder set's replacement model in ONNX Runtime (core/backend.py ReplacementModel):
its backward graph (MODEL_DIR/backward_{set}.onnx, export/backward.py), opened when first
asked for, and its members' matrices as memory maps of the files that hold them (the SAEs'
graphs' weights, the model's weights file for the unembedding): nothing is copied into RAM
that the pages do not hold already.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from attnserve.model.artifacts import (
    BACKWARD_INPUTS,
    BACKWARD_OUTPUTS,
    WEIGHTS_INDEX_FILENAME,
    ModelDirectory,
    backward_files,
)
from attnserve.model.config import ModelConfig
from attnserve.service.core.errors import InferenceError, UnsupportedError
from attnserve.service.core.replacement import FrozenPrompt
from attnserve.service.ort.features import SAEGraphs

_TRANSPOSED = ".T"  # a linear weight stored as its transpose (export/weights.py)


class OrtReplacement:
    """The replacement model of the transcoder set `name` of a model directory."""

    def __init__(
        self,
        model_dir: ModelDirectory,
        config: ModelConfig,
        name: str,
        saes: SAEGraphs,
        open_session: Callable[[str, ort.SessionOptions], ort.InferenceSession],
        options: Callable[[], ort.SessionOptions],
    ) -> None:
        graph, _, info = (model_dir.path / f for f in backward_files(name))
        if not graph.is_file() or not info.is_file():
            raise UnsupportedError(
                f"{model_dir.path} has no replacement model with transcoders {name!r}: "
                f"add a circuit-tracer transcoder set as {name!r} (`attnserve sae add "
                f"{model_dir.path} SET_DIR --name {name}`)"
            )
        described = json.loads(info.read_text())
        self.members: tuple[str, ...] = tuple(described["members"])
        self.scan: str = described.get("scan") or name
        missing = [m for m in self.members if m not in saes.configs]
        if missing:
            raise UnsupportedError(f"transcoders {name!r}: {missing} are not served")
        self._config, self._saes, self._path = config, saes, graph
        self._open = lambda: open_session(str(graph), options())
        self._session: ort.InferenceSession | None = None
        self._unembedding = _unembedding(model_dir.path, config)

    def _run(self, input_ids: np.ndarray, grads: np.ndarray, layers, positions, outputs):
        if self._session is None:
            self._session = self._open()
        feeds = dict(zip(BACKWARD_INPUTS, (input_ids[None], grads, layers, positions), strict=True))
        try:
            return self._session.run(list(outputs), feeds)
        except Exception as exc:  # ORT raises its own untyped errors
            raise InferenceError(f"ONNX Runtime failed on {self._path.name}: {exc}") from exc

    def freeze(self, input_ids: np.ndarray) -> FrozenPrompt:
        one = np.zeros((1, self._config.d_model), np.float32)  # a row of nothing
        zero = np.zeros(1, np.int64)
        inputs, outputs, logits, embeddings, skips = self._run(
            input_ids, one, zero, zero, BACKWARD_OUTPUTS[2:]
        )
        return FrozenPrompt(inputs, outputs, skips, logits, embeddings)

    def rows(
        self, input_ids: np.ndarray, grads: np.ndarray, layers: np.ndarray, positions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        mlp, embed = self._run(
            input_ids,
            np.ascontiguousarray(grads, np.float32),
            np.asarray(layers, np.int64),
            np.asarray(positions, np.int64),
            BACKWARD_OUTPUTS[:2],
        )
        return mlp, embed

    def activations(self, layer: int, x: np.ndarray) -> np.ndarray:
        return self._saes.activations(self.members[layer], x)

    def encoder(self, layer: int) -> np.ndarray:
        return self._saes.weight(self.members[layer], "W_enc")

    def decoder(self, layer: int) -> np.ndarray:
        return self._saes.weight(self.members[layer], "W_dec")

    def decoder_bias(self, layer: int) -> np.ndarray:
        return self._saes.weight(self.members[layer], "b_dec")

    def unembedding(self) -> np.ndarray:
        return self._unembedding


def _unembedding(model_dir: Path, config: ModelConfig) -> np.ndarray:
    """(V, D) the unembedding (the token table where tied) as the weights file holds it."""
    index = json.loads((model_dir / WEIGHTS_INDEX_FILENAME).read_text())
    name = "tok_emb.weight" if config.unembedding == "tied" else "lm_head.weight"
    for stored in (name, name + _TRANSPOSED):
        entry = index["tensors"].get(stored)
        if entry is not None:
            if entry["dtype"] != "FLOAT":
                break
            table = np.memmap(
                model_dir / index["file"],
                dtype="<f4",
                mode="r",
                offset=entry["offset"],
                shape=tuple(entry["shape"]),
            )
            return table.T if stored.endswith(_TRANSPOSED) else table
    raise UnsupportedError(f"{model_dir}: no float32 unembedding {name} in its weights file")
