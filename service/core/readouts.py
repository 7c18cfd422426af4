"""A request's readouts, planned: the head mask, hidden states, predictions, logit lens,
direct logit attribution and sparse-autoencoder features of each input, validated against
the model and what its directory can compute.

Readouts come from the readouts graph (the residual stream and its parts, a head-mask
input; SAE features of them, core/features.py), the lens graph (the final norm and
unembedding of any residual row) and the attribution graph (what each part adds to a
logit); `Backend.readouts` says which of them a served model has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.model.sae_config import SAEConfig
from attnserve.service.core.backend import (
    AttentionSelection,
    AttributionSelection,
    HiddenStatesSelection,
    PredictionsSelection,
    ReadoutSelection,
)
from attnserve.service.core.errors import InvalidInputError, UnsupportedError
from attnserve.service.core.features import (
    features_response_bytes,
    features_work_bytes,
    plan_features,
)
from attnserve.service.core.fields import indices, positions
from attnserve.service.core.request import (
    AttributionOptions,
    EncodeOptions,
    HeadScale,
    HiddenStatesOptions,
    LensNorm,
    PredictionsOptions,
)

STREAM = "stream"  # the readouts graph: hidden states and head masks
LENS = "lens"  # the lens graph: predictions and the logit lens
ATTRIBUTION = "attribution"  # the attribution graph: direct logit attribution
# the graph each option is read from
_GRAPH_OF = {
    "hidden_states": STREAM,
    "head_mask": STREAM,
    "predictions": LENS,
    "logit_lens": LENS,
    "attribution": ATTRIBUTION,
    "features": STREAM,
}
DEFAULT_TOP_K = 5
MAX_TOP_K = 1000
MAX_TARGETS = 1000
MAX_ATTRIBUTION_TARGETS = 64
# The lens runs over this many bytes of float32 logits at a time (the rows of a large grid
# go through in chunks), so that its memory is bounded whatever the grid.
LENS_CHUNK_BYTES = 64 * 1024 * 1024
_TOKEN_STRING_BYTES = 16  # about what a top token's display string weighs on the wire


def plan_readouts(
    options: EncodeOptions,
    config: ModelConfig,
    sequences: list[np.ndarray],
    attention: list[AttentionSelection] | None,
    readable: frozenset[str],
    saes: Mapping[str, SAEConfig],
) -> list[ReadoutSelection] | None:
    """One ReadoutSelection per sequence, or None when the request asks for no readout.
    `readable`: the graphs the backend has (Backend.readouts); `saes`: the SAEs it serves."""
    asked = [
        f
        for f in ("hidden_states", "predictions", "logit_lens", "attribution", "features")
        if getattr(options, f) is not None
    ]
    if options.head_mask:
        asked.append("head_mask")
    if not asked:
        return None
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
    head_mask, head_means = (
        _head_mask(options.head_mask, config) if options.head_mask else (None, None)
    )
    hidden, predictions, lens = options.hidden_states, options.predictions, options.logit_lens
    attribution, features = options.attribution, options.features
    selections = []
    for index, ids in enumerate(sequences):
        length = len(ids)
        selections.append(
            ReadoutSelection(
                head_mask=head_mask,
                head_means=head_means,
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
                features=None
                if features is None
                else plan_features(features, saes, config, length, index),
            )
        )
    return selections


def _head_mask(
    entries: tuple[HeadScale, ...], config: ModelConfig
) -> tuple[np.ndarray, np.ndarray | None]:
    """The scales (L, H), 1 but for the heads listed, and the means (L, H, d_k) if any
    entry has one (zeros elsewhere), float32."""
    mask = np.ones((config.n_layers, config.n_heads), dtype=np.float32)
    means = None
    seen = set()
    for i, entry in enumerate(entries):
        field = f"options.head_mask[{i}]"
        if not 0 <= entry.layer < config.n_layers:
            raise InvalidInputError(
                f"{field}.layer: {entry.layer} is outside [0, {config.n_layers})"
            )
        if not 0 <= entry.head < config.n_heads:
            raise InvalidInputError(f"{field}.head: {entry.head} is outside [0, {config.n_heads})")
        if not math.isfinite(entry.scale):
            raise InvalidInputError(f"{field}.scale: {entry.scale} is not a finite number")
        if (entry.layer, entry.head) in seen:
            raise InvalidInputError(
                f"{field}: layer {entry.layer} head {entry.head} is listed twice"
            )
        seen.add((entry.layer, entry.head))
        mask[entry.layer, entry.head] = entry.scale
        if entry.mean:
            if len(entry.mean) != config.head_dim:
                raise InvalidInputError(
                    f"{field}.mean: {len(entry.mean)} floats; a head's output has "
                    f"head_dim={config.head_dim}"
                )
            mean = np.asarray(entry.mean, dtype=np.float32)
            if not np.isfinite(mean).all():
                raise InvalidInputError(f"{field}.mean: not every value is a finite number")
            if means is None:
                means = np.zeros((*mask.shape, config.head_dim), dtype=np.float32)
            means[entry.layer, entry.head] = mean
    return mask, means


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
    return total


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
