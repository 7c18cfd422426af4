"""An attribution graph request, checked and planned once: the prompt's ids as
circuit-tracer attributes them (a special token first: one is put there unless the prompt
starts with one), the options in their ranges, and the memory one backward pass may hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.service.circuits.graph import GraphOptions
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.request import Input
from attnserve.service.core.view import ModelView

# What one backward pass's rows hold (their gradients at every MLP output and the tokens,
# float32): the rows per pass are planned to fit it, whatever batch_size asks.
BACKWARD_BYTES = 256 * 2**20


@dataclass(frozen=True, eq=False)
class GraphPlan:
    input_ids: np.ndarray  # int64 (T,), its first a special token
    transcoders: str  # the set's name
    options: GraphOptions
    max_rows: int  # rows of one backward pass, at most


def special_ids(config: ModelConfig) -> frozenset[int]:
    return frozenset({config.bos_id, config.eos_id, config.pad_id})


def plan_graph(
    item: Input,
    transcoders: str,
    options: GraphOptions,
    view: ModelView,
    sets: Sequence[str],
) -> GraphPlan:
    """Check a graph request against the served model and its transcoder sets `sets`
    (InvalidInputError naming the field and its limit); the prompt's ids with a special
    token first."""
    config = view.config
    if transcoders not in sets:
        held = (
            f"this model has {', '.join(sets)}"
            if sets
            else "this model has none: add a circuit-tracer set with `attnserve sae add`"
        )
        raise InvalidInputError(f"transcoders: no transcoder set {transcoders!r} ({held})")
    _check_options(options, config)
    if isinstance(item, str):
        field, ids = "prompt", np.asarray(view.tokenizer.token_ids(item), np.int64)
    else:
        field, ids = "prompt.token_ids", np.asarray(item, np.int64)
    if ids.ndim != 1 or not len(ids):
        raise InvalidInputError(f"{field}: the prompt is empty")
    bad = ids[(ids < 0) | (ids >= config.vocab_size)]
    if bad.size:
        raise InvalidInputError(
            f"{field}: token id {int(bad[0])} is outside the vocabulary [0, {config.vocab_size})"
        )
    if int(ids[0]) not in special_ids(config):  # circuit-tracer's: position 0 is ignored
        ids = np.concatenate([[config.bos_id], ids]).astype(np.int64)
    if len(ids) > config.max_seq_len:
        raise InvalidInputError(
            f"{field} has {len(ids)} tokens with the first special one, more than "
            f"max_seq_len={config.max_seq_len}"
        )
    per_row = 4 * (config.n_layers + 1) * len(ids) * config.d_model
    return GraphPlan(ids, transcoders, options, max(1, BACKWARD_BYTES // per_row))


def _check_options(options: GraphOptions, config: ModelConfig) -> None:
    def at_least(name: str, value: int | None, low: int, high: int | None = None) -> None:
        if value is not None and (value < low or (high is not None and value > high)):
            limit = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise InvalidInputError(f"{name}: must be {limit}, not {value}")

    at_least("max_n_logits", options.max_n_logits, 1, config.vocab_size)
    at_least("batch_size", options.batch_size, 1)
    at_least("max_feature_nodes", options.max_feature_nodes, 1)
    at_least("update_interval", options.update_interval, 1)
    fractions = {
        "desired_logit_prob": options.desired_logit_prob,
        "node_threshold": options.node_threshold,
        "edge_threshold": options.edge_threshold,
    }
    for name, value in fractions.items():
        if not 0.0 <= value <= 1.0:
            raise InvalidInputError(f"{name}: must be between 0 and 1, not {value}")
