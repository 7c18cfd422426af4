"""A request's readouts, planned: its changes and captures (core/interventions.py), hidden
states, predictions, logit lens, direct logit attribution and sparse-autoencoder features of
each input, validated against the model and what its directory can compute.

Readouts come from the readouts graph (the residual stream and its parts, a head-mask
input; SAE features of them, core/features.py), the lens graph (the final norm and
unembedding of any residual row) and the attribution graph (what each part adds to a
logit); `Backend.graphs` says which of them a served model has.
"""

from __future__ import annotations

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.service.core.backend import (
    AttentionSelection,
    AttributionSelection,
    HiddenStatesSelection,
    PredictionsSelection,
    ReadoutSelection,
)
from attnserve.service.core.capture import capture_bytes, plan_capture
from attnserve.service.core.errors import InvalidInputError, UnsupportedError
from attnserve.service.core.features import (
    features_response_bytes,
    features_work_bytes,
    plan_features,
)
from attnserve.service.core.fields import indices, positions
from attnserve.service.core.interventions import changes_bytes, plan_changes, plan_clamps
from attnserve.service.core.patching import plan_patching
from attnserve.service.core.request import (
    AttributionOptions,
    EncodeOptions,
    HiddenStatesOptions,
    LensNorm,
    PredictionsOptions,
)
from attnserve.service.core.view import ModelView

# The graphs a request may need, by their kinds in model/artifacts.py GRAPHS
STREAM = "readouts"  # the readouts graph: hidden states and head masks
CHANGES = "changes"  # ... taking changes of every site (exported with interventions)
LENS = "lens"  # the lens graph: predictions and the logit lens
ATTRIBUTION = "attribution"  # the attribution graph: direct logit attribution
DECODE = "decode"  # the decode graph: generation
QUERIES = "queries"  # the queries graph: attention statistics by query blocks
# the graph each option is read from
_GRAPH_OF = {  # in the order a refusal names them
    "hidden_states": STREAM,
    "predictions": LENS,
    "logit_lens": LENS,
    "attribution": ATTRIBUTION,
    "features": STREAM,
    "head_mask": STREAM,
    "interventions": STREAM,
    "capture": STREAM,
    "patching": LENS,
}
_STREAM_KINDS = ("resid_pre", "resid_mid", "resid_post")  # changes to the stream itself
DEFAULT_TOP_K = 5
MAX_TOP_K = 1000
MAX_TARGETS = 1000
MAX_ATTRIBUTION_TARGETS = 64
# The lens runs over this many bytes of float32 logits at a time (the rows of a large grid
# go through in chunks), so that its memory is bounded whatever the grid.
LENS_CHUNK_BYTES = 64 * 1024 * 1024
# Activation patching's runs go through the readouts graph this many bytes of work at a time.
PATCHING_CHUNK_BYTES = 256 * 1024 * 1024
_TOKEN_STRING_BYTES = 16  # about what a top token's display string weighs on the wire


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
    config = view.config
    asked = [field for field in _GRAPH_OF if getattr(options, field) not in (None, ())]
    if not asked:
        return None
    _refuse(asked, options, view)
    hidden, predictions, lens = options.hidden_states, options.predictions, options.logit_lens
    attribution, features = options.attribution, options.features
    selections = []
    for index, ids in enumerate(sequences):
        length = len(ids)
        changes = plan_changes(options.interventions, options.head_mask, view, length, index)
        clamps = plan_clamps(options.interventions, view, length, index)
        changed = {*changes, *(clamp.kind for clamp in clamps)}
        if attribution is not None and changed & set(_STREAM_KINDS):
            raise InvalidInputError(
                "options.attribution: the residual stream is changed by options.interventions, "
                "so its parts no longer add up to the logits; change what a sublayer writes "
                "(hook_attn_out, hook_mlp_out, hook_z) instead"
            )
        selections.append(
            ReadoutSelection(
                changes=changes,
                clamps=clamps,
                capture=None
                if options.capture is None
                else plan_capture(options.capture, config, length, index, changed),
                patching=None
                if options.patching is None or source is None
                else plan_patching(options.patching, config, source, length, index),
                attention=attention[index] if attention else None,
                hidden_states=None
                if hidden is None
                else _hidden_states(hidden, config, length, index),
                predictions=None
                if predictions is None
                else _predictions("options.predictions", predictions, config, length, index),
                lens=None
                if lens is None
                else _predictions("options.logit_lens", lens, config, length, index),
                attribution=None
                if attribution is None
                else _attribution(attribution, config, length, index),
                features=None if features is None else plan_features(features, view, length, index),
            )
        )
    return selections


def _refuse(asked: list[str], options: EncodeOptions, view: ModelView) -> None:
    """The readouts asked for that the served graphs cannot compute, or that cannot go
    together."""
    config, readable = view.config, view.graphs
    for field in asked:
        graph = _GRAPH_OF[field]
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
    for field in ("interventions", "patching"):
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


def _hidden_states(
    request: HiddenStatesOptions, config: ModelConfig, length: int, index: int
) -> HiddenStatesSelection:
    field = "options.hidden_states"
    layers = indices(f"{field}.layers", request.layers, config.n_layers + 1)
    if config.d_embed is not None and config.n_layers in layers:
        raise InvalidInputError(
            f"{field}.layers: state {config.n_layers} of {config.name} is its final norm's "
            f"output before the projection to the embeddings' {config.d_embed} dims, which "
            f"the served graphs do not return; ask for layers below {config.n_layers}"
        )
    if request.omit_states and not request.norms:
        raise InvalidInputError(
            f"{field}.omit_states leaves nothing to return: set {field}.norms too"
        )
    return HiddenStatesSelection(
        layers=tuple(layers),
        positions=_positions(f"{field}.positions", request.positions, length, index),
        states=not request.omit_states,
        norms=request.norms,
    )


def _predictions(
    field: str,
    request: PredictionsOptions,
    config: ModelConfig,
    length: int,
    index: int,
) -> PredictionsSelection:
    if field == "options.predictions":
        if request.layers:
            raise InvalidInputError(
                f"{field}.layers: predictions read the last layer; ask options.logit_lens "
                "for other layers"
            )
        layers = [config.n_layers]
    else:
        layers = indices(f"{field}.layers", request.layers, config.n_layers + 1)
    top_k = request.top_k or DEFAULT_TOP_K
    limit = min(MAX_TOP_K, config.vocab_size)
    if not 1 <= top_k <= limit:
        raise InvalidInputError(f"{field}.top_k: {request.top_k} is outside [1, {limit}]")
    if len(request.target_ids) > MAX_TARGETS:
        raise InvalidInputError(
            f"{field}.target_ids: {len(request.target_ids)} ids, more than {MAX_TARGETS}"
        )
    _token_ids(f"{field}.target_ids", request.target_ids, config)
    return PredictionsSelection(
        layers=tuple(layers),
        positions=_positions(f"{field}.positions", request.positions, length, index),
        top_k=top_k,
        targets=tuple(request.target_ids),
        logits=request.logits,
        own_norm=request.lens_norm == LensNorm.OWN,
    )


def _attribution(
    request: AttributionOptions, config: ModelConfig, length: int, index: int
) -> AttributionSelection:
    field = "options.attribution"
    targets, contrasts = request.target_ids, request.contrast_ids
    if not 1 <= len(targets) <= MAX_ATTRIBUTION_TARGETS:
        raise InvalidInputError(
            f"{field}.target_ids: {len(targets)} ids; give 1 to {MAX_ATTRIBUTION_TARGETS}"
        )
    if contrasts and len(contrasts) != len(targets):
        raise InvalidInputError(
            f"{field}.contrast_ids: {len(contrasts)} ids for {len(targets)} target_ids; "
            "give one per target, or none"
        )
    _token_ids(f"{field}.target_ids", targets, config)
    _token_ids(f"{field}.contrast_ids", contrasts, config)
    return AttributionSelection(
        positions=_positions(f"{field}.positions", request.positions, length, index),
        targets=tuple(targets),
        contrasts=tuple(contrasts),
    )


def _token_ids(field: str, ids: tuple[int, ...], config: ModelConfig) -> None:
    for token in ids:
        if not 0 <= token < config.vocab_size:
            raise InvalidInputError(
                f"{field}: {token} is outside the vocabulary [0, {config.vocab_size})"
            )


def _positions(name: str, values: tuple[int, ...], length: int, index: int) -> tuple[int, ...]:
    return positions(name, values, length, index) if values else tuple(range(length))


def readout_response_bytes(selection: ReadoutSelection, config: ModelConfig) -> int:
    """Bytes of what `selection` returns (attention is counted with the attention)."""
    total = 0
    hidden = selection.hidden_states
    if hidden is not None:
        vectors = len(hidden.layers) * len(hidden.positions)
        total += vectors * ((config.d_model * 4 if hidden.states else 0) + 4 * hidden.norms)
    for p in (selection.predictions, selection.lens):
        if p is not None:
            per_row = p.top_k * (8 + _TOKEN_STRING_BYTES) + 4 * len(p.targets)
            per_row += config.vocab_size * 4 if p.logits else 0
            total += len(p.layers) * len(p.positions) * per_row
    a = selection.attribution
    if a is not None:
        parts = config.n_layers * (config.n_heads + 2) + 2  # heads, biases, MLPs, x_0, 1
        total += len(a.positions) * len(a.targets) * parts * 4
    if selection.features is not None:
        total += features_response_bytes(selection.features)
    if selection.capture is not None:
        total += capture_bytes(selection.capture, config)
    if selection.patching is not None:
        total += config.n_layers * max(len(selection.patching.source), config.n_heads) * 4
    return total


def readout_work_bytes(selection: ReadoutSelection, config: ModelConfig, length: int) -> int:
    """What computing `selection` holds besides its answer: the readouts graph's residual
    stream (and its parts, for attribution), the lens's or the attribution's chunk
    (bounded by LENS_CHUNK_BYTES) while it runs, and the features' work."""
    total = 2 * (config.n_layers + 1) * length * config.d_model * 4
    if selection.attribution is not None:
        width = config.n_heads * config.head_dim + config.d_model  # heads and MLP, each layer
        total += 2 * config.n_layers * length * width * 4 + LENS_CHUNK_BYTES
    if selection.predictions is not None or selection.lens is not None:
        total += 2 * lens_chunk_rows(config.vocab_size) * config.vocab_size * 4
    if selection.features is not None:
        total += features_work_bytes(selection.features, config, length)
    if selection.patching is not None:  # its runs' chunk, and the lens' of their rows
        total += (
            PATCHING_CHUNK_BYTES + 2 * lens_chunk_rows(config.vocab_size) * config.vocab_size * 4
        )
    return total + changes_bytes(selection.changes)


def patching_chunk_rows(config: ModelConfig, length: int) -> int:
    """How many patched runs of `length` tokens go through the readouts graph at a time:
    each computes its attention weights (L, H, T, T) and holds its residual stream and a few
    more of its width (L + 1, T, D)."""
    L, H, D = config.n_layers, config.n_heads, max(config.d_model, config.n_heads * config.head_dim)
    per_row = 4 * (L * H * length * length + 6 * (L + 1) * length * D)
    return max(1, PATCHING_CHUNK_BYTES // per_row)


def lens_chunk_rows(vocab_size: int) -> int:
    """How many residual rows the lens runs at a time."""
    return max(1, LENS_CHUNK_BYTES // (vocab_size * 4))


def attribution_chunk_rows(config: ModelConfig, ids: int) -> int:
    """How many positions the attribution graph runs at a time, for `ids` target and
    contrast ids: each holds its ids' directions through the final norm and through each
    head's output projection, (ids, D + H*d_k) floats, and each head's output (H, D)."""
    per_row = 4 * (ids * (config.d_model + config.n_heads * config.head_dim))
    per_row += 4 * config.n_heads * config.d_model
    return max(1, LENS_CHUNK_BYTES // per_row)
