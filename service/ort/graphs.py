"""The sessions of a model directory's graphs opened on demand (model/artifacts.py GRAPHS'
rows with `on_demand`: readouts, lens, attribution, decode, queries), in the precision
served (model_lens_int8.onnx: its matrices in 8 bits, as model_int8.onnx's).

They open when first asked for, but for a model served by one session: that session runs
the readouts graph itself (service/ort/runtime.py), so reading the residual stream adds no
second copy of the weights. Where the model's memory layout allows copies of the weights
(service/models.py `session_layout`: not one session) they prepack them, as the served
graphs do: unpacked, every matrix product repacks its weights at every run (the lens
repacks the whole unembedding), which made a logit lens of 8 tokens cost 2.5x their
embeddings. In one session they read the weights where the file is mapped instead, adding
no copy (research/weights-in-memory); but for 8-bit graphs, which MatMulNBits would widen
to float32 whole at every run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from attnserve.model.artifacts import GRAPHS, HEAD_MASK_NAME, ON_DEMAND, ModelDirectory, graph_file
from attnserve.model.config import ModelConfig
from attnserve.service.core.errors import InferenceError, UnsupportedError
from attnserve.service.core.readouts import CHANGES, DECODE, QUERIES, STREAM


class GraphSessions:
    """The sessions of one served model's graphs opened on demand, by kind."""

    def __init__(
        self,
        model_dir: ModelDirectory,
        config: ModelConfig,
        precision: str,
        open_session: Callable[[str, ort.SessionOptions], ort.InferenceSession],
        options: Callable[[], ort.SessionOptions],
        prepack: bool = False,
        stream: ort.InferenceSession | None = None,
        packed_decode: bool | None = None,
    ) -> None:
        """`open_session(path, options)` opens a graph on the model's provider; `options()`
        makes the server's session options; `prepack`: let the sessions copy the weights;
        `stream`: the readouts graph's session, open already (kept by `close`);
        `packed_decode`: whether the decode graph's does (None: as `prepack` says)."""
        self.model_dir = model_dir
        self.config = config
        self.precision = precision
        self._open_session = open_session
        self._options = options
        self.prepack = prepack
        self.packed_decode = prepack if packed_decode is None else packed_decode
        self._kept = {STREAM: stream} if stream is not None else {}
        self._sessions: dict[str, ort.InferenceSession] = dict(self._kept)
        self._lock = threading.Lock()
        available = {kind for kind in ON_DEMAND if self.path(kind).is_file()}
        if STREAM in available and HEAD_MASK_NAME not in self.names(STREAM, "inputs"):
            available.add(CHANGES)  # exported with interventions, not a head mask alone
        self.available = frozenset(available)

    def path(self, kind: str) -> Path:
        """The file of the graph of `kind` in the precision served."""
        return self.model_dir.path / graph_file(kind, self.precision)

    def names(self, kind: str, side: str) -> frozenset[str]:
        """A graph's input ("inputs") or output ("outputs") names: its open session's, or
        read from its file (its weights stay on disk)."""
        if kind in self._sessions:
            session = self._sessions[kind]
            args = session.get_inputs() if side == "inputs" else session.get_outputs()
            return frozenset(arg.name for arg in args)
        graph = onnx.load(str(self.path(kind)), load_external_data=False).graph
        return frozenset(value.name for value in getattr(graph, side.removesuffix("s")))

    def session(self, kind: str) -> ort.InferenceSession:
        """The session of one graph, opened on first use; UnsupportedError where the
        directory has none (written before it, or a model without a head)."""
        marker = GRAPHS[kind].marker
        with self._lock:
            if kind in self._sessions:
                return self._sessions[kind]
            path = self.path(kind)
            if kind not in self.available:
                raise UnsupportedError(
                    f"{self.config.name} has no {marker} to read in {self.precision} "
                    f"({path.name}): readouts come from the graphs of a directory exported "
                    "by this version (re-export it with `attnserve export`)"
                )
            so = self._options()
            if not (self.packed_decode if kind == DECODE else self.prepack):
                so.add_session_config_entry("session.disable_prepacking", "1")
            if kind == QUERIES:  # long texts' tensors, few and large: the arena's
                so.enable_cpu_mem_arena = False  # power-of-two growth would hold up to twice
            session = self._open_session(str(path), so)
            if marker not in {o.name for o in session.get_outputs()}:
                raise UnsupportedError(
                    f"{path} has no {marker!r} output: it was exported before readouts "
                    "(re-export it with `attnserve export`)"
                )
            self._sessions[kind] = session
            return session

    def run_rows(
        self,
        kind: str,
        names: Sequence[str],
        rows: dict[str, np.ndarray],
        step: int,
        shared: dict[str, np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        """Run the graph of `kind` over the `rows` inputs (as many rows each) `step` rows
        at a time, the `shared` inputs (the lens' k) in every chunk, and join the outputs."""
        session = self.session(kind)
        count = len(next(iter(rows.values())))
        runs = []
        for start in range(0, max(count, 1), step):
            feeds = {name: x[start : start + step] for name, x in rows.items()} | (shared or {})
            try:
                runs.append(session.run(list(names), feeds))
            except Exception as exc:  # ORT raises its own untyped errors
                raise InferenceError(f"ONNX Runtime failed on the {kind} graph: {exc}") from exc
        return [
            column[0] if len(column) == 1 else np.concatenate(column)
            for column in zip(*runs, strict=True)
        ]

    def close(self) -> None:
        """Drop the sessions (their arenas go with them); reopened when next asked for. The
        one session of a model is kept."""
        with self._lock:
            self._sessions = dict(self._kept)
