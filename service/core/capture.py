"""The values a request captures, planned: where each hook site it names is among the
readouts graph's outputs, and the positions returned (activation patching's too:
core/patching.py)."""

from __future__ import annotations

from attnserve.model.config import ModelConfig
from attnserve.model.hooks import RESID_POST, RESID_PRE, hook_names, kind_heads, parse_site
from attnserve.model.readout_sites import stream_site
from attnserve.service.core.backend import CaptureSelection
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.fields import positions as checked_positions
from attnserve.service.core.interventions import unknown_site
from attnserve.service.core.request import CaptureOptions
from attnserve.service.core.view import InputContext


def plan_capture(capture: CaptureOptions, at: InputContext) -> CaptureSelection:
    """Where each hook site `capture` names is among the readouts graph's outputs, and the
    positions of the input it returns (after the input's changes)."""
    config, changed = at.config, at.changed
    if not capture.hooks:
        raise InvalidInputError("options.capture.hooks: name at least one hook site")
    sites: dict[str, tuple[str, int, tuple[int, ...]]] = {}
    for i, hook in enumerate(capture.hooks):
        field = f"options.capture.hooks[{i}]"
        if hook in sites:
            raise InvalidInputError(f"{field}: {hook} is named twice")
        place = stream_site(config, hook) if hook in hook_names(config) else None
        if place is None:
            raise InvalidInputError(f"{field}: {unknown_site(hook, config, 'capture')}")
        parsed = parse_site(hook, config)
        if parsed is not None and parsed[0] == "resid_post" and parsed[1] + 1 < config.n_layers:
            after = RESID_PRE.format(layer=parsed[1] + 1)
            if "resid_pre" in changed:  # the stream holds the next block's input: changed
                raise InvalidInputError(
                    f"{field}: {hook} is read where {after} begins, which this request "
                    f"changes; capture {after} (after its change) or change "
                    f"{RESID_POST.format(layer=parsed[1])} instead"
                )
        heads = kind_heads(config, parsed[0]) if parsed else None
        shape = (-1,) if heads is None else (heads, config.head_dim)
        sites[hook] = (*place, shape)
    positions = capture.positions
    field = "options.capture.positions"
    chosen = (
        checked_positions(field, positions, at.length, at.index) if positions else range(at.length)
    )
    return CaptureSelection(sites=sites, positions=tuple(chosen))


def capture_bytes(selection: CaptureSelection, config: ModelConfig) -> int:
    """Bytes of the values a capture returns."""
    return (
        len(selection.sites)
        * len(selection.positions)
        * max(config.d_model, config.n_heads * config.head_dim)
        * 4
    )
