"""The readouts of the residual stream, planned: hidden states, next-token predictions, the
logit lens and direct logit attribution of one input, each validated against the model;
what each returns and what computing it holds (rows of core/readouts.py READOUTS)."""

from __future__ import annotations

from attnserve.model.config import ModelConfig
from attnserve.service.core.backend import (
    AttributionSelection,
    HiddenStatesSelection,
    PredictionsSelection,
)
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.fields import indices, positions
from attnserve.service.core.request import (
    AttributionOptions,
    HiddenStatesOptions,
    LensNorm,
    PredictionsOptions,
)
from attnserve.service.core.view import InputContext

DEFAULT_TOP_K = 5
MAX_TOP_K = 1000
MAX_TARGETS = 1000
MAX_ATTRIBUTION_TARGETS = 64
# The lens runs over this many bytes of float32 logits at a time (the rows of a large grid
# go through in chunks), so that its memory is bounded whatever the grid.
LENS_CHUNK_BYTES = 64 * 1024 * 1024
_TOKEN_STRING_BYTES = 16  # about what a top token's display string weighs on the wire
_STREAM_KINDS = ("resid_pre", "resid_mid", "resid_post")  # changes to the stream itself


def plan_hidden_states(request: HiddenStatesOptions, at: InputContext) -> HiddenStatesSelection:
    field, config = "options.hidden_states", at.config
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
        positions=_positions(f"{field}.positions", request.positions, at),
        states=not request.omit_states,
        norms=request.norms,
    )


def hidden_states_bytes(selection: HiddenStatesSelection, config: ModelConfig) -> int:
    vectors = len(selection.layers) * len(selection.positions)
    return vectors * ((config.d_model * 4 if selection.states else 0) + 4 * selection.norms)


def plan_predictions(request: PredictionsOptions, at: InputContext) -> PredictionsSelection:
    """The last layer's next-token predictions."""
    field = "options.predictions"
    if request.layers:
        raise InvalidInputError(
            f"{field}.layers: predictions read the last layer; ask options.logit_lens "
            "for other layers"
        )
    return _predictions(field, request, [at.config.n_layers], at)


def plan_lens(request: PredictionsOptions, at: InputContext) -> PredictionsSelection:
    """The logit lens: any state's predictions."""
    field = "options.logit_lens"
    layers = indices(f"{field}.layers", request.layers, at.config.n_layers + 1)
    return _predictions(field, request, layers, at)


def _predictions(
    field: str, request: PredictionsOptions, layers: list[int], at: InputContext
) -> PredictionsSelection:
    config = at.config
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
        positions=_positions(f"{field}.positions", request.positions, at),
        top_k=top_k,
        targets=tuple(request.target_ids),
        logits=request.logits,
        own_norm=request.lens_norm == LensNorm.OWN,
    )


def predictions_bytes(selection: PredictionsSelection, config: ModelConfig) -> int:
    per_row = selection.top_k * (8 + _TOKEN_STRING_BYTES) + 4 * len(selection.targets)
    per_row += config.vocab_size * 4 if selection.logits else 0
    return len(selection.layers) * len(selection.positions) * per_row


def lens_work_bytes(_: object, config: ModelConfig, length: int) -> int:
    """The lens's chunk of logits while it runs (and their softmax): one, whichever asks."""
    return 2 * lens_chunk_rows(config.vocab_size) * config.vocab_size * 4


def lens_chunk_rows(vocab_size: int) -> int:
    """How many residual rows the lens runs at a time."""
    return max(1, LENS_CHUNK_BYTES // (vocab_size * 4))


def plan_attribution(request: AttributionOptions, at: InputContext) -> AttributionSelection:
    field, config = "options.attribution", at.config
    if at.changed & set(_STREAM_KINDS):
        raise InvalidInputError(
            f"{field}: the residual stream is changed by options.interventions, so its "
            "parts no longer add up to the logits; change what a sublayer writes "
            "(hook_attn_out, hook_mlp_out, hook_z) instead"
        )
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
        positions=_positions(f"{field}.positions", request.positions, at),
        targets=tuple(targets),
        contrasts=tuple(contrasts),
    )


def attribution_bytes(selection: AttributionSelection, config: ModelConfig) -> int:
    parts = config.n_layers * (config.n_heads + 2) + 2  # heads, biases, MLPs, x_0, 1
    return len(selection.positions) * len(selection.targets) * parts * 4


def attribution_work_bytes(_: object, config: ModelConfig, length: int) -> int:
    """The stream's parts (each layer's heads and MLP) and the attribution's chunk."""
    width = config.n_heads * config.head_dim + config.d_model
    return 2 * config.n_layers * length * width * 4 + LENS_CHUNK_BYTES


def attribution_chunk_rows(config: ModelConfig, ids: int) -> int:
    """How many positions the attribution graph runs at a time, for `ids` target and
    contrast ids: each holds its ids' directions through the final norm and through each
    head's output projection, (ids, D + H*d_k) floats, and each head's output (H, D)."""
    per_row = 4 * (ids * (config.d_model + config.n_heads * config.head_dim))
    per_row += 4 * config.n_heads * config.d_model
    return max(1, LENS_CHUNK_BYTES // per_row)


def _token_ids(field: str, ids: tuple[int, ...], config: ModelConfig) -> None:
    for token in ids:
        if not 0 <= token < config.vocab_size:
            raise InvalidInputError(
                f"{field}: {token} is outside the vocabulary [0, {config.vocab_size})"
            )


def _positions(name: str, values: tuple[int, ...], at: InputContext) -> tuple[int, ...]:
    return positions(name, values, at.length, at.index) if values else tuple(range(at.length))
