"""The ORT sessions that compute what a request wants of one sequence's attention.

An `AttentionSelection` (service/core/backend.py) is planned once per input (service/core/plan.py);
the ORT backend hands it with that sequence's full weights to `AttentionReducer`, which
runs the matching graph of service/ort/reducer_graph.py on the serving provider and returns
an `AttentionOutput` ready for the wire.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np
import onnx
import onnxruntime as ort

from attnserve.model.packing import pack_causal
from attnserve.service.core.backend import AttentionOutput, AttentionSelection
from attnserve.service.ort.reducer_graph import Recipe, build_graph

R = TypeVar("R")  # a graph's recipe: frozen, hashable


class AttentionReducer:
    """Runs selections on a provider; one ORT session per recipe, the most recent kept."""

    def __init__(
        self,
        providers: list,
        session_options: ort.SessionOptions,
        n_layers: int,
        n_heads: int,
        max_sessions: int = 32,
    ) -> None:
        self._all_layers = tuple(range(n_layers))
        self._all_heads = tuple(range(n_heads))
        self._sessions = RecipeSessions(build_graph, providers, session_options, max_sessions)

    def __call__(
        self, attention: np.ndarray, length: int, selection: AttentionSelection
    ) -> AttentionOutput:
        """attention: float32 (L, H, Tm, Tm), the sequence's row of its batch's output,
        of which the first `length` rows and keys are the sequence's."""
        s = selection
        rows = np.arange(length) if s.rows is None else np.asarray(s.rows)
        recipe = Recipe(
            trim=length < attention.shape[-1],
            pick_layers=s.layers != self._all_layers,
            pick_heads=s.heads != self._all_heads,
            pick_rows=s.rows is not None,
            reduction=s.reduction,
            rollout_layers=len(s.layers) if s.rollout else 0,
            top_k=s.top_k > 0,
            entropy=s.entropy,
            weights=s.weights,
            float16=s.float16,
        )
        feeds = {
            "attention": attention,
            "length": np.array([length], dtype=np.int64),
            "layers": np.asarray(s.layers, dtype=np.int64),
            "heads": np.asarray(s.heads, dtype=np.int64),
            "rows": rows.astype(np.int64),
            "k": np.array([s.top_k], dtype=np.int64),
        }
        if recipe == Recipe():  # nothing to compute: the weights as the model wrote them
            out = {"weights": attention}
        else:
            session = self._sessions(recipe)
            names = [o.name for o in session.get_outputs()]
            values = session.run(names, {name: feeds[name] for name in recipe.inputs})
            out = dict(zip(names, values, strict=True))
        weights = out.get("weights")
        if weights is not None and s.packed:
            weights = pack_causal(weights)  # (L', H', T (T + 1) / 2)
        return AttentionOutput(rows, weights, out.get("indices"), out.get("entropy"))

    def close_sessions(self) -> None:
        self._sessions.clear()


class RecipeSessions(Generic[R]):
    """One ORT session per recipe of a small graph (`build(recipe)`), the most recently used
    `max_sessions` kept; safe across threads."""

    def __init__(
        self,
        build: Callable[[R], onnx.ModelProto],
        providers: list,
        session_options: ort.SessionOptions,
        max_sessions: int,
    ) -> None:
        self._build, self._providers = build, providers
        self._session_options, self._max_sessions = session_options, max_sessions
        self._sessions: OrderedDict[R, ort.InferenceSession] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, recipe: R) -> ort.InferenceSession:
        with self._lock:
            session = self._sessions.get(recipe)
            if session is None:
                session = ort.InferenceSession(
                    self._build(recipe).SerializeToString(),
                    self._session_options,
                    providers=self._providers,
                )
                self._sessions[recipe] = session
                if len(self._sessions) > self._max_sessions:
                    self._sessions.popitem(last=False)
            self._sessions.move_to_end(recipe)
            return session

    def clear(self) -> None:
        with self._lock:
            self._sessions.clear()
