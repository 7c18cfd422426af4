"""A request's changes to the model's run, planned: interventions (add, set or scale a
hook site's value) and the head mask, as one SiteChange per kind of site (x -> x * scale +
add at every layer, the readouts graph's inputs), each validated against the model (what a
request captures: core/capture.py).

Changes compose in the order given, the head mask first: at a position an `add` adds to
whatever came before, a `set` replaces it, a `scale` scales both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.model.hooks import (
    changeable,
    hook_names,
    kind_heads,
    parse_site,
)
from attnserve.model.readout_sites import stream_site
from attnserve.service.core.backend import (
    Clamp,
    SiteChange,
)
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.fields import positions as checked_positions
from attnserve.service.core.request import (
    HeadScale,
    Intervention,
)
from attnserve.service.core.view import ModelView

OPS = ("add", "set", "scale", "clamp")
# SAE normalisations under which the decoder's output is rescaled per position
_PER_POSITION = ("constant_norm_rescale", "layer_norm")


def plan_changes(
    interventions: tuple[Intervention, ...],
    head_mask: tuple[HeadScale, ...],
    view: ModelView,
    length: int,
    index: int,
) -> dict[str, SiteChange]:
    """The changes of inputs[index] (`length` tokens) by kind of site: its head mask (on
    every hook_z) and then its interventions, in order (a feature's by its decoder row, of
    one of the view's SAEs)."""
    config = view.config
    changes: dict[str, _Change] = {}
    if head_mask:
        mask, means = head_mask_arrays(head_mask, config)
        z = changes.setdefault("z", _Change(config, "z", 1))
        z.scale[:] = mask[:, None, :, None]
        if means is not None:
            z.add[:] = means[:, None]
    planned = []
    for i, entry in enumerate(interventions):
        if entry.op == "clamp":  # plan_clamps'
            continue
        if entry.feature is not None:
            entry = _feature(f"options.interventions[{i}]", entry, view)
        planned.append(_plan(i, entry, config, length, index))
    for kind, layer, rows, heads, op, values, scale in planned:
        change = changes.get(kind)
        per_position = rows is not None or (values is not None and values.ndim == 2)
        if change is None:
            change = changes[kind] = _Change(config, kind, length if per_position else 1)
        elif per_position and change.positions == 1:
            change.spread(length)
        change.apply(layer, rows, heads, op, values, scale)
    return {kind: SiteChange(change.scale, change.add) for kind, change in changes.items()}


def plan_clamps(
    interventions: tuple[Intervention, ...], view: ModelView, length: int, index: int
) -> tuple[Clamp, ...]:
    """The features inputs[index] clamps, each at its SAE's site."""
    config, clamps = view.config, []
    for i, entry in enumerate(interventions):
        if entry.op != "clamp":
            continue
        field = f"options.interventions[{i}]"
        if entry.feature is None:
            raise InvalidInputError(
                f"{field}.feature: op clamp sets a feature's activation; name it"
            )
        if entry.scale is None or not math.isfinite(entry.scale):
            raise InvalidInputError(
                f"{field}.scale: op clamp sets the feature's activation to it; set a finite value"
            )
        sae = view.saes.get(entry.feature[0])
        if sae is not None and sae.transcoder:
            raise InvalidInputError(
                f"{field}.feature: {entry.feature[0]!r} is a transcoder: its features are read "
                f"at {sae.hook_name} and written at {sae.hook_name_out}, so clamping one is "
                "not served; steer with op add instead"
            )
        row = _feature(field, replace(entry, op="add"), view)
        kind, layer = parse_site(row.hook, config) or ("", 0)
        if not kind:
            raise InvalidInputError(f"{field}.feature: {unknown_site(row.hook, config)}")
        field = f"{field}.positions"
        chosen = (
            checked_positions(field, entry.positions, length, index)
            if entry.positions
            else range(length)
        )
        assert row.values is not None and entry.feature is not None
        clamps.append(
            Clamp(*entry.feature, float(entry.scale), kind, layer, tuple(chosen), row.values)
        )
    return tuple(clamps)


def head_mask_arrays(
    entries: tuple[HeadScale, ...], config: ModelConfig
) -> tuple[np.ndarray, np.ndarray | None]:
    """The head mask's scales (L, H), 1 but for the heads listed, and the means (L, H, d_k)
    if any entry has one (zeros elsewhere), float32."""
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


def changes_bytes(changes: Mapping[str, SiteChange]) -> int:
    """What a row's changes hold, and its rows of the batch's inputs made of them."""
    return 2 * sum(change.scale.nbytes + change.add.nbytes for change in changes.values())


class _Change:
    """One kind of site's change being composed: scale (L, P, 1) and add (L, P, D), or a
    per-head site's (L, P, heads, 1) and (L, P, heads, d_k), P 1 (every position) or the
    input's length."""

    def __init__(self, config: ModelConfig, kind: str, positions: int) -> None:
        L = config.n_layers
        heads = kind_heads(config, kind)
        self.per_head = heads is not None
        if heads is not None:
            d_k = config.head_dim
            self.scale = np.ones((L, positions, heads, 1), dtype=np.float32)
            self.add = np.zeros((L, positions, heads, d_k), dtype=np.float32)
        else:
            self.scale = np.ones((L, positions, 1), dtype=np.float32)
            self.add = np.zeros((L, positions, config.d_model), dtype=np.float32)

    @property
    def positions(self) -> int:
        return self.scale.shape[1]

    def spread(self, length: int) -> None:
        """From one change for every position to one per position (a later intervention
        names positions)."""
        self.scale = np.repeat(self.scale, length, axis=1)
        self.add = np.repeat(self.add, length, axis=1)

    def apply(
        self,
        layer: int,
        rows: np.ndarray | None,
        heads: np.ndarray | None,
        op: str,
        values: np.ndarray | None,
        scale: float,
    ) -> None:
        """One intervention at `layer`, `rows` (None: every position) and `heads` (a
        per-head site's; None: every head); values (width,) or (rows, width), a per-head
        site's width one head's with heads named, else every head's side by side."""
        where = np.arange(self.positions) if rows is None else rows
        index: tuple[int | np.ndarray, ...] = (layer, where)  # (P, 1) of scale, (P, D) of add
        if self.per_head:  # (P, heads, 1) and (P, heads, d_k)
            chosen = np.arange(self.scale.shape[2]) if heads is None else heads
            index = (layer, where[:, None], chosen[None, :])
            if values is not None:
                d_k = self.add.shape[-1]
                if heads is None:  # the heads side by side, as the site's width is flattened
                    values = values.reshape(*values.shape[:-1], -1, d_k)
                elif values.ndim == 2:  # one row per position, the same for each head
                    values = values[:, None, :]
        if op == "scale":
            self.scale[index] *= scale
            self.add[index] *= scale
        elif op == "set":
            assert values is not None
            self.scale[index] = 0.0
            self.add[index] = scale * values
        else:
            assert values is not None
            self.add[index] += scale * values


def _feature(field: str, entry: Intervention, view: ModelView) -> Intervention:
    """An intervention by an SAE feature as one by its values: the feature's decoder row,
    at the SAE's site."""
    name, feature_id = entry.feature or ("", 0)
    saes, direction = view.saes, view.direction
    sae = saes.get(name)
    if sae is None or direction is None:
        raise InvalidInputError(
            f"{field}.feature.sae: {name!r} is not an SAE this model serves {sorted(saes)}"
        )
    if not 0 <= feature_id < sae.d_sae:
        raise InvalidInputError(
            f"{field}.feature.feature_id: {feature_id} is outside [0, {sae.d_sae}) ({name})"
        )
    if entry.values is not None and entry.values.size:
        raise InvalidInputError(f"{field}: give values or feature, not both")
    site = sae.output_hook  # where its decoder writes (a transcoder's: not where it reads)
    if entry.hook and entry.hook != site:
        raise InvalidInputError(
            f"{field}.hook: {entry.hook}, but SAE {name!r} writes {site}: name its "
            "site or leave hook empty"
        )
    if entry.op == "scale" or entry.heads:
        what = "op scale takes no values" if entry.op == "scale" else "its row spans every head"
        raise InvalidInputError(f"{field}.feature: {what}")
    if sae.normalize_activations in _PER_POSITION:
        raise InvalidInputError(
            f"{field}.feature: SAE {name!r} rescales its decoder's output per position "
            f"({sae.normalize_activations}), so a feature has no one direction at its site; "
            "send the direction as values"
        )
    return replace(entry, hook=site, values=direction(name, feature_id), feature=None)


def _plan(
    i: int, entry: Intervention, config: ModelConfig, length: int, index: int
) -> tuple[str, int, np.ndarray | None, np.ndarray | None, str, np.ndarray | None, float]:
    """One intervention checked: (kind, layer, positions or None, heads or None, op, values
    (width,) or (positions, width) or None, scale)."""
    field = f"options.interventions[{i}]"
    parsed = parse_site(entry.hook, config)
    if parsed is None:
        raise InvalidInputError(f"{field}.hook: {unknown_site(entry.hook, config)}")
    kind, layer = parsed
    if entry.op not in OPS:
        raise InvalidInputError(f"{field}.op: {entry.op!r} is not one of {list(OPS)}")
    scale = 1.0 if entry.scale is None else float(entry.scale)
    if entry.op == "scale" and entry.scale is None:
        raise InvalidInputError(f"{field}.scale: op scale multiplies by it; set it")
    if not math.isfinite(scale):
        raise InvalidInputError(f"{field}.scale: {scale} is not a finite number")
    heads = None
    if entry.heads:
        count = kind_heads(config, kind)
        if count is None:
            raise InvalidInputError(
                f"{field}.heads: only the attention's sites have heads (attn.hook_q, hook_k, "
                f"hook_v, hook_z); {entry.hook} has none"
            )
        for head in entry.heads:
            if not 0 <= head < count:
                raise InvalidInputError(f"{field}.heads: {head} is outside [0, {count})")
        if len(set(entry.heads)) != len(entry.heads):
            raise InvalidInputError(f"{field}.heads: {list(entry.heads)} repeats a head")
        heads = np.asarray(entry.heads)
    rows = None
    if entry.positions:
        rows = np.asarray(checked_positions(f"{field}.positions", entry.positions, length, index))
    values = _values(field, entry, kind, config, heads is not None, rows, length)
    return kind, layer, rows, heads, entry.op, values, scale


def _values(
    field: str,
    entry: Intervention,
    kind: str,
    config: ModelConfig,
    by_head: bool,
    rows: np.ndarray | None,
    length: int,
) -> np.ndarray | None:
    """The intervention's values checked: none for scale; else (width,) or one row per
    position, float32 and finite."""
    values = entry.values
    if entry.op == "scale":
        if values is not None and values.size:
            raise InvalidInputError(
                f"{field}.values: op scale multiplies by scale alone; leave values empty"
            )
        return None
    if values is None or not values.size:
        raise InvalidInputError(f"{field}.values: op {entry.op} needs values")
    heads = kind_heads(config, kind)
    if heads is None:
        width, what = config.d_model, "d_model"
    elif by_head:
        width, what = config.head_dim, "head_dim (one head's)"
    else:
        width, what = heads * config.head_dim, f"{heads} heads x head_dim (every head's)"
    count = length if rows is None else len(rows)
    allowed = f"[{width}] or [{count}, {width}] (one row per position)"
    if values.ndim not in (1, 2) or values.shape[-1] != width:
        raise InvalidInputError(
            f"{field}.values: shape {list(values.shape)}; {entry.hook} takes {allowed}: "
            f"its width is {what} = {width}"
        )
    if values.ndim == 2 and len(values) != count:
        raise InvalidInputError(
            f"{field}.values: {len(values)} rows for {count} positions; give {allowed}"
        )
    values = values.astype(np.float32, copy=False)
    if not np.isfinite(values).all():
        raise InvalidInputError(f"{field}.values: not every value is a finite number")
    return values


def returned(config: ModelConfig) -> dict[str, str]:
    """The changeable sites the readouts graph returns too (captured, patched): not the
    queries, keys and values."""
    return {
        kind: site
        for kind, site in changeable(config).items()
        if stream_site(config, site.format(layer=0)) is not None
    }


def unknown_site(hook: str, config: ModelConfig, verb: str = "change") -> str:
    """Why a request cannot `verb` (change, capture) site `hook`, and which it can."""
    sites = changeable(config) if verb == "change" else returned(config)
    kinds = ", ".join(site.format(layer="{layer}") for site in sites.values())
    where = f"blocks.{{layer}} for 0 <= layer < {config.n_layers}"
    if hook in hook_names(config):
        return f"{hook} is not one of the sites a request can {verb}: {kinds} ({where})"
    return f"{hook!r} is not a hook site of {config.name}; these are: {kinds} ({where})"
