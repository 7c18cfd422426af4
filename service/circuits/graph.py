"""An attribution graph's options and the unpruned graph itself, under circuit-tracer's
names (its attribute()'s arguments, its Graph's fields)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np


@dataclass(frozen=True)
class GraphOptions:
    """circuit-tracer 0.5.0's attribute() and prune_graph() arguments, its defaults."""

    max_n_logits: int = 10  # logit targets: at most this many of the most likely tokens,
    desired_logit_prob: float = 0.95  # ... until their probabilities sum to this
    batch_size: int = 512  # rows of one backward pass (fewer where memory is short)
    max_feature_nodes: int | None = None  # None: every active feature, in order
    update_interval: int = 4  # batches between re-rankings of the features to visit
    node_threshold: float = 0.8  # pruning: the nodes holding this share of the influence
    edge_threshold: float = 0.98  # ... and the edges holding this share of theirs


KNOBS = tuple(field.name for field in fields(GraphOptions))


def graph_options(given: Mapping[str, Any]) -> GraphOptions:
    """The options `given` names (a request's fields; the others ignored), the defaults for
    the rest: every API's request takes circuit-tracer's argument names."""
    return GraphOptions(**{name: given[name] for name in KNOBS if name in given})


@dataclass(frozen=True, eq=False)
class AttributionGraph:
    """The direct effect of every node on every node it reaches, one prompt's, unpruned.

    Nodes, in order: the selected features (by their place in active_features), an error
    per layer and position (layer-major), a token per position, the logit targets. Row t,
    column s of adjacency_matrix: s's direct effect on t."""

    input_tokens: np.ndarray  # int64 (T,)
    logit_targets: np.ndarray  # int64 (K,) token ids, the most likely first
    logit_probabilities: np.ndarray  # float32 (K,)
    active_features: np.ndarray  # int64 (F, 3): (layer, position, feature), sorted
    activation_values: np.ndarray  # float32 (F,)
    selected_features: np.ndarray  # int64 (F',): the feature nodes, into active_features
    adjacency_matrix: np.ndarray  # float32 (N, N), N = F' + (L + 1) T + K
    n_layers: int

    @property
    def n_features(self) -> int:
        return len(self.selected_features)

    def node(self, index: int) -> tuple[str, int, int, int]:
        """Node `index` as (kind, layer, position, feature or token id): kind "feature",
        "error", "token" or "logit" (a logit's layer is L, its position the last)."""
        T, L = len(self.input_tokens), self.n_layers
        errors = self.n_features + L * T
        if index < self.n_features:
            layer, position, feature = self.active_features[self.selected_features[index]]
            return "feature", int(layer), int(position), int(feature)
        if index < errors:
            layer, position = divmod(index - self.n_features, T)
            return "error", layer, position, -1
        if index < errors + T:
            position = index - errors
            return "token", -1, position, int(self.input_tokens[position])
        return "logit", L, T - 1, int(self.logit_targets[index - errors - T])
