"""HookPoint: an identity module at each named site (model/hooks.py), and the two ways to use
them: read a site's value (`captured`) or change it (`hooked`), for one forward pass.

As TransformerLens' HookPoint, each is an nn.Module whose forward hooks PyTorch runs; the
ONNX exporter traces them like any code, so a graph builder decides which sites a graph
reads out (an output) and which a request may change (an input). Nothing is threaded
through the model's forward signatures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from attnserve.model.hooks import Z

# A change: the site's value in, its new value out (or None: unchanged).
Hook = Callable[[torch.Tensor], torch.Tensor | None]


class HookPoint(nn.Module):
    """The identity, at a site named `name`; hooks read or replace what passes."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @property
    def active(self) -> bool:
        """Whether a hook reads or changes this site now (a graph traced without one costs
        nothing for it)."""
        return bool(self._forward_hooks)

    def extra_repr(self) -> str:
        return self.name


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every HookPoint of `model` by its site name."""
    return {m.name: m for m in model.modules() if isinstance(m, HookPoint)}


@contextmanager
def hooked(model: nn.Module, hooks: Mapping[str, Hook]) -> Iterator[None]:
    """Run `model` with each named site passed through its hook; in order of registration,
    so a later `captured` reads what an earlier hook made of a site."""
    points = hook_points(model)
    unknown = sorted(set(hooks) - set(points))
    if unknown:
        raise KeyError(f"no hook point {unknown[0]!r} in this model (it has {len(points)})")
    handles = [
        points[name].register_forward_hook(lambda _m, _args, out, hook=hook: hook(out))
        for name, hook in hooks.items()
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def captured(model: nn.Module, names: list[str]) -> Iterator[dict[str, torch.Tensor]]:
    """Run `model` with the value of each named site stored in the yielded dict."""
    values: dict[str, torch.Tensor] = {}

    def store(name: str) -> Hook:
        def hook(x: torch.Tensor) -> None:
            values[name] = x

        return hook

    with hooked(model, {name: store(name) for name in names}):
        yield values


def site_changes(
    sites: Mapping[str, str],
    changes: Mapping[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
) -> dict[str, Hook]:
    """Changes at every layer of each kind of site: x -> x * scale + add * gate, where
    `changes[kind]` is (scale, add, gate), each (B or 1, L, T or 1, ...) broadcast against
    the site's value at its layer, (B, T, D) or hook_z's (B, T, H, d_k); `sites[kind]` is
    its hook name template (model/hooks.py CHANGEABLE). Steering adds a vector (scale 1,
    gate 1), setting replaces the value (scale 0), patching takes some positions from another
    run (add: its values, shared by every row; gate: 1 where a row takes them, scale 1 - gate)."""

    def change(scale: torch.Tensor, add: torch.Tensor, gate: torch.Tensor, layer: int) -> Hook:
        def hook(x: torch.Tensor) -> torch.Tensor:
            return x * scale[:, layer] + add[:, layer] * gate[:, layer]

        return hook

    hooks = {}
    for kind, (scale, add, gate) in changes.items():
        for layer in range(scale.shape[1]):
            hooks[sites[kind].format(layer=layer)] = change(scale, add, gate, layer)
    return hooks


def head_ablation(mask: torch.Tensor, means: torch.Tensor | None = None) -> dict[str, Hook]:
    """Changes on each layer's hook_z that scale each head's output and then add a vector of
    its own: mask (L, H) or (B, L, H), 0 removes a head and 1 keeps it; means (L, H, d_k) or
    (B, L, H, d_k) (mean-ablation: mask 0 and the head's mean output)."""

    def change(layer: int) -> Hook:
        def hook(z: torch.Tensor) -> torch.Tensor:  # (B, T, H, d_k)
            z = z * mask[..., layer, :].unsqueeze(-2).unsqueeze(-1)  # (B or 1, 1, H, 1)
            if means is not None:
                z = z + means[..., layer, :, :].unsqueeze(-3)  # (B or 1, 1, H, d_k)
            return z

        return hook

    return {Z.format(layer=layer): change(layer) for layer in range(mask.shape[-2])}


def stacked(
    values: Mapping[str, torch.Tensor], sites: Mapping[str, list[str]]
) -> dict[str, torch.Tensor]:
    """Each output of `sites` (model/readout_sites.py): its sites' captured values,
    (B, T, ...) each, flattened to (B, T, width) and stacked to (B, sites, T, width)."""
    return {
        name: torch.stack([values[site].flatten(2) for site in names], dim=1)
        for name, names in sites.items()
    }
