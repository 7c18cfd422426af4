"""The planning context: one served model as a request sees it.

The data plane builds a ModelView of its backend once (and again when SAEs are added to the
directory it serves), and every planner takes it with the request: the config, the
tokenizer, the graphs it can compute from, its SAEs and their features' directions. Planners
never reach into the backend, and transports read the model off the view, not the backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.model.sae_config import SAEConfig
from attnserve.model.tokenizer import Tokenizer

# (SAE name, feature id) -> the feature's decoder row (d_in,) (Backend.feature_direction)
Direction = Callable[[str, int], np.ndarray]


@dataclass(frozen=True)
class ModelView:
    """What planning a request reads of one served model."""

    config: ModelConfig
    tokenizer: Tokenizer
    graphs: frozenset[str] = frozenset()  # the graph kinds it has (Backend.graphs)
    saes: Mapping[str, SAEConfig] = field(default_factory=dict)  # served SAEs, by name
    direction: Direction | None = None  # a served SAE feature's decoder row
    version: str = ""  # its weights' hash (Backend.version)
    provider: str = ""  # where it runs: "cpu" or "cuda"
    precision: str = ""  # "fp32", "fp16" or "int8"
    gradient_lengths: Sequence[int] = ()  # Backend.gradient_lengths


@dataclass(frozen=True)
class InputContext:
    """One input of a request as its readouts are planned (core/readouts.py READOUTS)."""

    view: ModelView
    length: int  # its tokens
    index: int  # its place among the request's inputs (errors name inputs[index])
    changed: frozenset[str] = frozenset()  # the kinds of site its changes change
    source: np.ndarray | None = None  # options.patching's source, tokenized and checked

    @property
    def config(self) -> ModelConfig:
        return self.view.config
