"""The model's norms: LayerNorm and RMSNorm (Gemma's 1 + w too), each named one with
TransformerLens' two sites (hook_scale, hook_normalized), and a norm with its scale frozen
(the logit lens, attribution, the replacement model of model/replacement.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.model import hooks
from attnserve.model.config import ModelConfig
from attnserve.model.hook_points import HookPoint


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w (Llama); Gemma stores w - 1 and scales by (1 + w)."""

    def __init__(self, dim: int, eps: float, plus_one: bool = False, name: str = "") -> None:
        super().__init__()
        self.eps = eps
        self.offset = 1.0 if plus_one else 0.0
        self.weight = nn.Parameter(torch.zeros(dim) if plus_one else torch.ones(dim))
        add_norm_sites(self, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if watched(self):
            return through_sites(self, x)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * (self.offset + self.weight)


class LayerNorm(nn.LayerNorm):
    """torch's LayerNorm (its fused op in the graphs), with the sites of a named norm."""

    def __init__(self, dim: int, eps: float, name: str = "") -> None:
        super().__init__(dim, eps=eps)
        add_norm_sites(self, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return through_sites(self, x) if watched(self) else super().forward(x)


def add_norm_sites(norm: nn.Module, name: str) -> None:
    """A named norm's hook points (model/hooks.py norm_sites): hook_scale, what it divides
    by, and hook_normalized, x standardized by it; the queries' and keys' norms have none."""
    if name:
        norm.hook_scale = HookPoint(f"{name}.{hooks.SCALE}")
        norm.hook_normalized = HookPoint(f"{name}.{hooks.NORMALIZED}")


def watched(norm: nn.Module) -> bool:
    """Whether a hook reads or changes one of the norm's sites now."""
    points = [getattr(norm, f"hook_{site}", None) for site in ("scale", "normalized")]
    return any(isinstance(p, HookPoint) and p.active for p in points)


def through_sites(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`norm` of x in its three steps, each through its site: the scale (a hook may give
    it, frozen: then the norm is linear in x), x standardized by it, the weight and bias.
    Only for whoever hooks a site: the graphs keep the norm's one op otherwise."""
    scale = norm.get_submodule("hook_scale")(norm_scale(norm, x))  # (..., 1)
    return reweigh(norm, norm.get_submodule("hook_normalized")(standardized(norm, x, scale)))


def standardized(norm: nn.Module, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x standardized by `norm`'s scale (its hook_normalized): centred first by a LayerNorm."""
    if isinstance(norm, nn.LayerNorm):
        x = x - x.mean(-1, keepdim=True)
    return x / scale


def make_norm(config: ModelConfig, dim: int | None = None, name: str = "") -> nn.Module:
    """The model's norm over `dim` features (d_model unless given), with the sites of
    `name` (model/hooks.py) where it has one."""
    dim = dim or config.d_model
    if config.norm == "layernorm":
        return LayerNorm(dim, config.layer_norm_eps, name)
    plus_one = config.norm == "rmsnorm_plus_one"
    return RMSNorm(dim, config.layer_norm_eps, plus_one, name)


def reweigh(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The rest of `norm` on a standardized x: times its weight, plus its bias."""
    if isinstance(norm, nn.LayerNorm):
        x = x * norm.weight
        return x if norm.bias is None else x + norm.bias
    assert isinstance(norm, RMSNorm)
    return x * (norm.offset + norm.weight)


def norm_scale(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What `norm` divides x (..., D) by: (..., 1), sqrt(var + eps) or sqrt(mean x^2 + eps)."""
    if isinstance(norm, nn.LayerNorm):
        return torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + norm.eps)
    assert isinstance(norm, RMSNorm)
    return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)


def frozen_norm(norm: nn.Module, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`norm` of x with its scale given, not computed from x: affine in x, so the parts of
    a residual stream add up to the norm of their sum (the logit lens, attribution)."""
    linear = frozen_linear(norm, x, scale)
    return linear + norm.bias if isinstance(norm, nn.LayerNorm) else linear


def frozen_linear(norm: nn.Module, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """frozen_norm's part linear in x (all of it but a LayerNorm's bias): what one part of
    x contributes to the norm of the whole, `scale` the whole's."""
    x = standardized(norm, x, scale)
    if isinstance(norm, nn.LayerNorm):
        return x * norm.weight
    assert isinstance(norm, RMSNorm)
    return x * (norm.offset + norm.weight)


class NormSite(nn.Module):
    """One of `norm`'s sites from what it reads: its output (an MLP's hook_in) where
    `weighted`, else x standardized (its hook_normalized). An SAE reading that site is
    served from the stream the norm reads (model/readout_sites.py normed_site)."""

    def __init__(self, norm: nn.Module, weighted: bool) -> None:
        super().__init__()
        self.norm, self.weighted = norm, weighted

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        if self.weighted:
            return self.norm(x)
        return standardized(self.norm, x, norm_scale(self.norm, x))


class EachHeadNorm(nn.Module):
    """StableLM's q/k norm: a LayerNorm over head_dim with a weight of each head's own and
    no bias, on (B, H, T, d_k)."""

    def __init__(self, heads: int, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(heads, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x, x.shape[-1:], eps=self.eps)  # (B, H, T, d_k)
        return x * self.weight[:, None, :]
