"""Activation patching on the readouts graph, in a few batched runs: the source's run gives
the value of one kind of site at every layer and position; then the input runs once per
(layer, position) (hook_z: per (layer, head), at every position), each row with that one
place taken from the source by the graph's change inputs (scale 1 - gate, add the source's
values, gate 1 at the place, 0 elsewhere), many rows per run; each row's last position read
through the lens graph as logit(target) - logit(contrast). TransformerLens' patching module
runs the same forwards one at a time (`get_act_patch_resid_pre`,
`get_act_patch_attn_head_out_all_pos`).

Attribution patching (Nanda 2023; Syed et al. 2023) estimates the same grid from one run of
each and one backward: the input's difference plus, at each place, (source - input) times
the difference's gradient at the input's run, summed over the place's values."""

from __future__ import annotations

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.model.hooks import CHANGEABLE, kind_heads
from attnserve.model.readout_sites import stream_site
from attnserve.service.core.backend import Patching, PatchingSelection
from attnserve.service.core.patching import patching_chunk_rows
from attnserve.service.ort.gradient import GradientGraphs
from attnserve.service.ort.readouts import Readouts


def patch(graphs: Readouts, ids: np.ndarray, selection: PatchingSelection) -> Patching:
    """The patching grid of the input `ids` (T,) int64 against its selection's source."""
    config, kind = graphs.config, selection.kind
    L, T = config.n_layers, len(ids)
    output, first = _place(config, kind)
    both = graphs.stream(np.stack([selection.source, ids]), [{}, {}], False, [output])
    source = both.output(output)[:1, first : first + L]  # (1, L, T, width)
    clean, corrupted = _differences(graphs, both.residual[:, -1, T - 1], selection)
    heads = kind_heads(config, kind)
    if heads is not None:  # a head at every position: (L, 1, H, 1) places
        source = source.reshape(1, L, T, heads, config.head_dim)
        place_shape: tuple[int, ...] = (L, 1, heads, 1)
    else:  # a position's whole vector: (L, T, 1) places
        place_shape = (L, T, 1)
    places = int(np.prod(place_shape))
    step = patching_chunk_rows(config, T)
    values = []
    for start in range(0, places, step):
        rows = np.arange(start, min(places, start + step))
        gate = np.zeros((len(rows), places), dtype=np.float32)
        gate[np.arange(len(rows)), rows] = 1.0  # row r takes place r from the source
        gate = gate.reshape(len(rows), *place_shape)
        feeds = {f"{kind}_scale": 1.0 - gate, f"{kind}_add": source, f"{kind}_gate": gate}
        run = graphs.stream(np.tile(ids, (len(rows), 1)), feeds, attentions=False)
        values.append(_differences(graphs, run.residual[:, -1, T - 1], selection))
    grid = np.concatenate(values).reshape(L, -1)  # (L, T) or (L, H)
    return Patching(values=grid, clean=float(clean), corrupted=float(corrupted))


def attribution_patch(
    graphs: Readouts, gradients: GradientGraphs, ids: np.ndarray, selection: PatchingSelection
) -> Patching:
    """The linear estimate of `patch`'s grid, and the input's saliency by the same gradient:
    each token's embedding times its gradient, summed over d_model."""
    config, kind = graphs.config, selection.kind
    L, T = config.n_layers, len(ids)
    output, first = _place(config, kind)
    both = graphs.stream(np.stack([selection.source, ids]), [{}, {}], False, [output])
    values = both.output(output)[:, first : first + L]  # (2, L, T, width)
    clean, _ = _differences(graphs, both.residual[:, -1, T - 1], selection)
    length, target, contrast = selection.gradient_length, selection.target, selection.contrast
    got = gradients.run(ids, length, target, contrast)
    change = (values[0] - values[1]) * got[f"{kind}_grad"]  # (L, T, width)
    heads = kind_heads(config, kind)
    if heads is not None:  # a head at every position: (L, H)
        grid = change.reshape(L, T, heads, config.head_dim).sum(axis=(1, 3))
    else:
        grid = change.sum(-1)  # (L, T)
    corrupted = float(got["metric"][0])
    saliency = (got["embed"] * got["embed_grad"]).sum(-1)  # (T,)
    return Patching(
        values=(corrupted + grid).astype(np.float32),
        clean=float(clean),
        corrupted=corrupted,
        saliency=saliency.astype(np.float32),
    )


def _place(config: ModelConfig, kind: str) -> tuple[str, int]:
    """The readouts graph's output holding layer 0's site of `kind`, and its index there
    (the other layers follow it)."""
    place = stream_site(config, CHANGEABLE[kind].format(layer=0))
    assert place is not None  # every changeable site is among the outputs
    return place


def _differences(graphs: Readouts, last: np.ndarray, selection: PatchingSelection) -> np.ndarray:
    """logit(target) - logit(contrast) (N,) of the last layer's rows `last` (N, D): the
    lens of x_L by its own norm is the model's logits."""
    rows = np.ascontiguousarray(last)
    logits = graphs.lens(rows, rows, logits=True).logits
    assert logits is not None
    return logits[:, selection.target] - logits[:, selection.contrast]
