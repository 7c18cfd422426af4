"""A request's readouts, planned: its changes (core/interventions.py), then each readout it
asks of each input, by the table of readout kinds (READOUTS), validated against the model
and what its directory can compute; what they return and what computing them holds.

Readouts come from the readouts graph (the residual stream and its parts, a head-mask
input; SAE features of them, core/features.py), the lens graph (the final norm and
unembedding of any residual row) and the attribution graph (what each part adds to a
logit); `Backend.graphs` says which of them a served model has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from attnserve.model.artifacts import ATTRIBUTION_PARTS
from attnserve.model.config import ModelConfig
from attnserve.service.core.backend import AttentionSelection, ReadoutSelection
from attnserve.service.core.capture import capture_bytes, plan_capture
from attnserve.service.core.errors import InvalidInputError, UnsupportedError
from attnserve.service.core.features import (
    features_response_bytes,
    features_work_bytes,
    plan_features,
)
from attnserve.service.core.interventions import changes_bytes, plan_changes, plan_clamps
from attnserve.service.core.patching import (
    patching_bytes,
    patching_work_bytes,
    plan_patching,
)
from attnserve.service.core.request import (
    AttributionOptions,
    CaptureOptions,
    EncodeOptions,
    FeaturesOptions,
    HiddenStatesOptions,
    PatchingOptions,
    PredictionsOptions,
)
from attnserve.service.core.residual import (
    attribution_bytes,
    attribution_work_bytes,
    hidden_states_bytes,
    lens_work_bytes,
    plan_attribution,
    plan_hidden_states,
    plan_lens,
    plan_predictions,
    predictions_bytes,
)
from attnserve.service.core.view import InputContext, ModelView

# The graphs a request may need, by their kinds in model/artifacts.py GRAPHS
STREAM = "readouts"  # the readouts graph: hidden states and head masks
CHANGES = "changes"  # ... taking changes of every site (exported with interventions)
LENS = "lens"  # the lens graph: predictions and the logit lens
ATTRIBUTION = "attribution"  # the attribution graph: direct logit attribution
DECODE = "decode"  # the decode graph: generation
QUERIES = "queries"  # the queries graph: attention statistics by query blocks


def _none(*_: object) -> int:
    return 0


@dataclass(frozen=True)
class ReadoutKind:
    """One kind of readout, as every layer names it: a row of READOUTS, from which the plan,
    the memory budget and the Open Inference Protocol's outputs are derived (a new readout
    is a row, its kernel in service/ort/readouts.py and each protocol's fields)."""

    option: str  # its field of EncodeOptions (and of attnserve.v1's EncodeOptions)
    options: type  # that field's type (core/request.py)
    graph: str  # the graph it is read from (a kind of model/artifacts.py GRAPHS)
    selection: str  # its field of ReadoutSelection (and of ReadoutOutput)
    plan: Callable[[Any, InputContext], Any]  # options, one input -> its selection
    answer_bytes: Callable[[Any, ModelConfig], int]  # what a selection returns
    work_bytes: Callable[[Any, ModelConfig, int], int] = _none  # what computing it holds
    v2: tuple[str, ...] = ()  # the Open Inference Protocol outputs it fills


READOUTS = (
    ReadoutKind(
        "hidden_states", HiddenStatesOptions, STREAM, "hidden_states", plan_hidden_states,
        hidden_states_bytes, v2=("hidden_states", "hidden_state_norms"),
    ),
    ReadoutKind(
        "predictions", PredictionsOptions, LENS, "predictions", plan_predictions,
        predictions_bytes, lens_work_bytes,
        v2=("logits", "next_token_ids", "next_token_probabilities", "target_probabilities"),
    ),
    ReadoutKind(
        "logit_lens", PredictionsOptions, LENS, "lens", plan_lens, predictions_bytes,
        lens_work_bytes, v2=("lens_token_ids", "lens_probabilities", "lens_target_probabilities"),
    ),
    ReadoutKind(
        "attribution", AttributionOptions, ATTRIBUTION, "attribution", plan_attribution,
        attribution_bytes, attribution_work_bytes,
        v2=tuple(f"attribution_{part}" for part in ATTRIBUTION_PARTS),
    ),
    ReadoutKind(
        "features", FeaturesOptions, STREAM, "features", plan_features, features_response_bytes,
        features_work_bytes,
        v2=("sae_top_ids", "sae_top_activations", "sae_l0", "sae_error_norm",
            "sae_feature_activations", "sae_activations"),
    ),
    ReadoutKind("capture", CaptureOptions, STREAM, "capture", plan_capture, capture_bytes),
    ReadoutKind(
        "patching", PatchingOptions, LENS, "patching", plan_patching, patching_bytes,
        patching_work_bytes,
        v2=("patching", "patching_clean", "patching_corrupted", "patching_saliency"),
    ),
)  # fmt: skip
# The changes, planned before the readouts (which are read under them), from the stream's
# graph; and the options that change sites other than hook_z, from a graph that takes them.
_CHANGES = ("head_mask", "interventions")
_CHANGING = ("interventions", "patching")


def plan_readouts(
    options: EncodeOptions,
    view: ModelView,
    sequences: list[np.ndarray],
    attention: list[AttentionSelection] | None,
    source: np.ndarray | None = None,
) -> list[ReadoutSelection] | None:
    """One ReadoutSelection per sequence, or None when the request asks for no readout,
    from the graphs the view has; `source`: options.patching's source, tokenized and
    checked."""
    asked = [kind for kind in READOUTS if getattr(options, kind.option) is not None]
    if not asked and not any(getattr(options, field) for field in _CHANGES):
        return None
    _refuse(asked, options, view)
    selections = []
    for index, ids in enumerate(sequences):
        length = len(ids)
        changes = plan_changes(options.interventions, options.head_mask, view, length, index)
        clamps = plan_clamps(options.interventions, view, length, index)
        changed = frozenset({*changes, *(clamp.kind for clamp in clamps)})
        at = InputContext(view, length, index, changed, source)
        selection = ReadoutSelection(
            changes=changes, clamps=clamps, attention=attention[index] if attention else None
        )
        planned = {kind.selection: kind.plan(getattr(options, kind.option), at) for kind in asked}
        selections.append(replace(selection, **planned))
    return selections


def _refuse(asked: list[ReadoutKind], options: EncodeOptions, view: ModelView) -> None:
    """The readouts asked for that the served graphs cannot compute, or that cannot go
    together."""
    config, readable = view.config, view.graphs
    needs = [(kind.option, kind.graph) for kind in asked]
    needs += [(field, STREAM) for field in _CHANGES if getattr(options, field)]
    for field, graph in needs:
        if field == "attribution" and config.attribution_refusal is not None:
            raise UnsupportedError(
                f"options.attribution: {config.name} has no direct logit attribution: "
                f"{config.attribution_refusal}"
            )
        if graph not in readable:
            raise UnsupportedError(
                f"options.{field}: {config.name} cannot compute it as served: readouts come "
                "from the graphs of a directory exported with them"
                + (", of a model with an unembedding" if graph != STREAM else "")
                + " (re-export it with `attnserve export`)"
            )
    for field in _CHANGING:
        if getattr(options, field) and CHANGES not in readable:
            raise UnsupportedError(
                f"options.{field}: {config.name} was exported before interventions: its "
                "readouts graph changes heads only (re-export it with `attnserve export`)"
            )
    if options.patching is not None and (options.interventions or options.head_mask):
        raise InvalidInputError(
            "options.patching: patches the inputs as they are; leave options.interventions "
            "and options.head_mask empty (or patch with captures and interventions yourself)"
        )


def _planned(selection: ReadoutSelection) -> list[tuple[ReadoutKind, Any]]:
    """The readouts `selection` asks for, each with its kind's selection."""
    chosen = ((kind, getattr(selection, kind.selection)) for kind in READOUTS)
    return [(kind, asked) for kind, asked in chosen if asked is not None]


def readout_response_bytes(selection: ReadoutSelection, config: ModelConfig) -> int:
    """Bytes of what `selection` returns (attention is counted with the attention)."""
    return sum(kind.answer_bytes(asked, config) for kind, asked in _planned(selection))


def readout_work_bytes(selection: ReadoutSelection, config: ModelConfig, length: int) -> int:
    """What computing `selection` holds besides its answer: the readouts graph's residual
    stream, its changes, and each readout's work while it runs (the lens's chunk counted
    once, whichever readouts use it)."""
    total = 2 * (config.n_layers + 1) * length * config.d_model * 4
    works = {kind.work_bytes: asked for kind, asked in _planned(selection)}
    total += sum(work(asked, config, length) for work, asked in works.items())
    return total + changes_bytes(selection.changes)
