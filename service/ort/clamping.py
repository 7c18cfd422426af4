"""SAE features clamped: x + (value - a(x)) * W_dec[feature] at the SAE's site, a(x) the
feature's activation of the site as the run makes it (the reconstruction error kept, as
SAELens' clamping leaves it). a(x) depends on everything before the site, so each clamped
site takes a run of the readouts graph of its own, in the forward's order; the clamps
become per-position additions to the rows' changes, which the request's run then makes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnserve.model.hooks import CHANGEABLE, kind_heads
from attnserve.model.readout_sites import stream_site
from attnserve.service.core.backend import ReadoutSelection, SiteChange
from attnserve.service.ort.features import SAEGraphs
from attnserve.service.ort.readouts import Readouts

_ORDER = list(CHANGEABLE)  # a block's sites in the order its forward reaches them


def clamped(
    graphs: Readouts,
    saes: SAEGraphs | None,
    input_ids: np.ndarray,
    lengths: list[int],
    selections: Sequence[ReadoutSelection],
) -> list[dict[str, SiteChange]]:
    """Each row's changes with its clamps made additions (its changes alone where it has
    none): one run per site clamped in the batch, each after the ones before it."""
    changes = [dict(selection.changes) for selection in selections]
    sites = sorted(
        {(clamp.layer, _ORDER.index(clamp.kind)) for s in selections for clamp in s.clamps}
    )
    for layer, order in sites:
        kind = _ORDER[order]
        output, index = _place(graphs, kind, layer)
        run = graphs.stream(input_ids, changes, attentions=False, sites=[output])
        for row, selection in enumerate(selections):
            here = [c for c in selection.clamps if (c.layer, c.kind) == (layer, kind)]
            if not here:
                continue
            assert saes is not None  # the plan clamps only the SAEs served
            n = lengths[row]
            x = run.output(output)[row, index, :n]  # (n, width): the site as changed so far
            delta = np.zeros_like(x)
            for clamp in here:
                activation = saes.activations(clamp.sae, x)[:, clamp.feature]  # (n,)
                rows = list(clamp.positions)
                delta[rows] += (clamp.value - activation[rows])[:, None] * clamp.direction
            changes[row][kind] = _added(changes[row].get(kind), graphs, kind, layer, delta)
    return changes


def _place(graphs: Readouts, kind: str, layer: int) -> tuple[str, int]:
    place = stream_site(graphs.config, CHANGEABLE[kind].format(layer=layer))
    assert place is not None  # every changeable site is among the outputs
    return place


def _added(
    change: SiteChange | None, graphs: Readouts, kind: str, layer: int, delta: np.ndarray
) -> SiteChange:
    """`change` (None: none yet) with `delta` (n, width) added at `layer`, per position."""
    config = graphs.config
    n = len(delta)
    heads = kind_heads(config, kind)
    tail: tuple[int, ...] = ()
    if heads is not None:  # the SAE read the heads side by side
        delta = delta.reshape(n, heads, config.head_dim)
        tail = (heads,)
    L = config.n_layers
    if change is None:
        scale = np.ones((L, n, *tail, 1), dtype=np.float32)
        add = np.zeros((L, n, *delta.shape[1:]), dtype=np.float32)
    else:  # every position's, or the row's own
        scale = np.broadcast_to(change.scale, (L, n, *change.scale.shape[2:])).copy()
        add = np.broadcast_to(change.add, (L, n, *change.add.shape[2:])).copy()
    add[layer] += delta
    return SiteChange(scale, add)
