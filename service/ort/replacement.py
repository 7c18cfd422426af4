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
    BACKWARD_OUTPUTS,
    WEIGHTS_INDEX_FILENAME,
    ModelDirectory,
    backward_files,
    backward_inputs,
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
        prepack: bool = True,
    ) -> None:
        """`prepack`: let the session copy the weights into ONNX Runtime's packed layout (as
        the readouts graphs do); else it reads them where the weights file is mapped."""
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
        self._open = lambda: open_session(str(graph), _options(options(), prepack))
        self._session: ort.InferenceSession | None = None
        self._unembedding = _unembedding(model_dir.path, config)

    def _run(self, input_ids: np.ndarray, grads, positions, outputs):
        """The graph on the prompt and rows given layer by layer (L + 1 of each)."""
        if self._session is None:
            self._session = self._open()
        names = backward_inputs(self._config.n_layers)
        feeds = dict(zip(names, (input_ids[None], *grads, *positions), strict=True))
        try:
            return self._session.run(list(outputs), feeds)
        except Exception as exc:  # ORT raises its own untyped errors
            raise InferenceError(f"ONNX Runtime failed on {self._path.name}: {exc}") from exc

    def freeze(self, input_ids: np.ndarray) -> FrozenPrompt:
        L, D = self._config.n_layers, self._config.d_model
        # a row of nothing at the logits, none elsewhere
        grads = [np.zeros((int(layer == L), D), np.float32) for layer in range(L + 1)]
        positions = [np.zeros(len(g), np.int64) for g in grads]
        inputs, outputs, logits, embeddings, skips = self._run(
            input_ids, grads, positions, BACKWARD_OUTPUTS[2:]
        )
        return FrozenPrompt(inputs, outputs, skips, logits, embeddings)

    def rows(
        self, input_ids: np.ndarray, grads: np.ndarray, layers: np.ndarray, positions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each group of rows (`position_groups`) runs on the prompt's prefix up to its last
        position: with causal attention nothing after a row's position reaches it, so the
        rest of the prompt would only add zeros (exact, and a row at position p costs about
        (p + 1) / T of a whole pass). Within a pass, the graph runs each block on the rows
        of its layer and above (model/replacement.py layered)."""
        L, (T,), D = self._config.n_layers, input_ids.shape, self._config.d_model
        positions, layers = np.asarray(positions, np.int64), np.asarray(layers, np.int64)
        mlp = np.zeros((len(positions), L, T, D), np.float32)
        embed = np.zeros((len(positions), T, D), np.float32)
        for group in position_groups(positions):
            length = max(int(positions[group].max()) + 1, 2)  # the graph's shortest prompt
            group = group[np.argsort(layers[group], kind="stable")]  # in layer order
            by_layer = [group[layers[group] == layer] for layer in range(L + 1)]
            mlp[group, :, :length], embed[group, :length] = self._run(
                input_ids[:length],
                [np.ascontiguousarray(grads[rows], np.float32) for rows in by_layer],
                [positions[rows] for rows in by_layer],
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


def _options(so: ort.SessionOptions, prepack: bool) -> ort.SessionOptions:
    if not prepack:
        so.add_session_config_entry("session.disable_prepacking", "1")
    return so


# What one pass costs beyond its rows, in rows: the prompt's forward it recomputes, and
# ONNX Runtime's own work per run (a guess of the right size: 8 of the default model's rows)
_PASS_ROWS = 8


def position_groups(positions: np.ndarray, overhead: float = _PASS_ROWS) -> list[np.ndarray]:
    """The rows (indices into positions) in groups of neighbouring positions that cost
    least as passes over the prompt's prefix to each group's last position: a pass of n
    rows up to position p costs about (n + overhead) (p + 1). Exact by dynamic programming
    over the distinct positions (at most one per row)."""
    order = np.argsort(positions, kind="stable")
    distinct, counts = np.unique(positions[order], return_counts=True)
    before = np.concatenate([[0], np.cumsum(counts)])  # rows at the first i positions
    cost = np.zeros(len(distinct) + 1)
    cut = np.zeros(len(distinct) + 1, np.int64)  # where the best grouping's last group starts
    for j in range(1, len(distinct) + 1):
        # the last group holds distinct positions i..j-1, for each i < j
        options = cost[:j] + (before[j] - before[:j] + overhead) * (distinct[j - 1] + 1)
        cut[j] = int(np.argmin(options))
        cost[j] = options[cut[j]]
    groups, j = [], len(distinct)
    while j:
        groups.append(order[before[cut[j]] : before[j]])
        j = int(cut[j])
    return groups[::-1]


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
