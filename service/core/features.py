"""A request's sparse-autoencoder features, planned: the SAEs it names are served, its
positions resolve, and top_k and feature_ids fit every SAE it names. What they cost in the
response and while computed.

Features are computed from the readouts graph's run (the hook site each SAE reads is one of
its outputs: model/artifacts.py `stream_site`) by each SAE's own graph
(service/ort/features.py).
"""

from __future__ import annotations

from attnserve.model.artifacts import PARTS_NAMES, RESIDUAL_STREAM_NAME
from attnserve.model.config import ModelConfig
from attnserve.model.readout_sites import normed_site, stream_site
from attnserve.model.sae_config import SAEConfig
from attnserve.service.core.backend import FeaturesSelection
from attnserve.service.core.errors import InvalidInputError, UnsupportedError
from attnserve.service.core.fields import positions
from attnserve.service.core.request import FeaturesOptions
from attnserve.service.core.view import InputContext

DEFAULT_TOP_K = 10
MAX_TOP_K = 1000
MAX_FEATURE_IDS = 1000
FIELD = "options.features"


def plan_features(request: FeaturesOptions, at: InputContext) -> FeaturesSelection:
    """The input's FeaturesSelection; InvalidInputError names the field and the limit."""
    saes, config, length, index = at.view.saes, at.config, at.length, at.index
    served = ", ".join(sorted(saes)) or "none (add one with `attnserve sae add`)"
    if not request.saes:
        raise InvalidInputError(f"{FIELD}.saes: name at least one; {config.name} serves {served}")
    for i, name in enumerate(request.saes):
        if name not in saes:
            raise InvalidInputError(
                f"{FIELD}.saes[{i}]: {name!r} is not an SAE of {config.name}; it serves {served}"
            )
    if len(set(request.saes)) != len(request.saes):
        raise InvalidInputError(f"{FIELD}.saes: {list(request.saes)} names an SAE twice")
    widths = sorted({saes[name].d_sae for name in request.saes})
    top_k = request.top_k or min(DEFAULT_TOP_K, widths[0])
    limit = min(MAX_TOP_K, widths[0])
    if not 1 <= top_k <= limit:
        raise InvalidInputError(f"{FIELD}.top_k: {request.top_k} is outside [1, {limit}]")
    if len(request.feature_ids) > MAX_FEATURE_IDS:
        raise InvalidInputError(
            f"{FIELD}.feature_ids: {len(request.feature_ids)} ids, more than {MAX_FEATURE_IDS}"
        )
    for feature in request.feature_ids:
        if not 0 <= feature < widths[0]:
            raise InvalidInputError(
                f"{FIELD}.feature_ids: {feature} is outside [0, d_sae={widths[0]})"
            )
    if request.dense and len(widths) > 1:
        raise InvalidInputError(
            f"{FIELD}.dense: the SAEs named are {widths} features wide; ask for the dense "
            "activations of SAEs of one width per request"
        )
    chosen = positions(f"{FIELD}.positions", request.positions, length, index)
    chosen = chosen or tuple(range(length))
    if request.skip_first_token:
        chosen = tuple(p for p in chosen if p != 0)
        if not chosen:
            raise InvalidInputError(
                f"{FIELD}.skip_first_token leaves no position of inputs[{index}] to read"
            )
    return FeaturesSelection(
        saes=tuple(request.saes),
        widths=tuple(saes[name].d_sae for name in request.saes),
        positions=chosen,
        top_k=top_k,
        feature_ids=tuple(request.feature_ids),
        dense=request.dense,
        error_norm=not request.skip_error_norm,
        sites=_sites([saes[name] for name in request.saes], config, not request.skip_error_norm),
    )


def site_of(sae: SAEConfig, config: ModelConfig, output: bool = False) -> tuple[str, int]:
    """The readouts graph's output that holds the site `sae` reads (or the site its norm
    reads, where a norm computes it: model/readout_sites.py normed_site; `output`: the one its
    decoder writes, a transcoder's other site), and its index there (`attnserve sae add`
    writes only SAEs whose sites it returns)."""
    hook = sae.output_hook if output else sae.hook_name
    normed = None if output else normed_site(config, hook)
    site = stream_site(config, hook if normed is None else normed.source)
    if site is None:
        raise UnsupportedError(f"{hook} is not a site the readouts graph returns")
    return site


def _sites(saes: list[SAEConfig], config: ModelConfig, error_norm: bool) -> tuple[str, ...]:
    """The readouts graph's outputs `saes` read: their sites, and the transcoders' output
    sites where the error is measured."""
    sites = [site_of(sae, config)[0] for sae in saes]
    if error_norm:
        sites += [site_of(sae, config, output=True)[0] for sae in saes if sae.transcoder]
    return tuple(dict.fromkeys(sites))


def features_response_bytes(selection: FeaturesSelection, config: ModelConfig) -> int:
    """Bytes of what `selection` returns: per SAE and position, the top k (ids and
    activations), L0, the error's norm, the feature_ids' activations and the dense ones."""
    per_row = selection.top_k * 12 + 8 + 4 * selection.error_norm + 4 * len(selection.feature_ids)
    dense = 4 * sum(selection.widths) if selection.dense else 0
    return len(selection.positions) * (len(selection.saes) * per_row + dense)


def features_work_bytes(selection: FeaturesSelection, config: ModelConfig, length: int) -> int:
    """What computing `selection` holds besides its answer: each readouts output an SAE
    reads besides the residual stream (every layer's, in ONNX Runtime and copied out), and
    (SAEs run one at a time) the widest SAE's pre-activations, activations and top k at
    its positions."""
    heads = config.n_heads * config.head_dim
    widths = [
        heads if site == PARTS_NAMES[0] else config.d_model
        for site in selection.sites
        if site != RESIDUAL_STREAM_NAME  # counted with the readouts' work
    ]
    total = sum(2 * config.n_layers * length * width * 4 for width in widths)
    return total + 3 * len(selection.positions) * max(selection.widths) * 4
