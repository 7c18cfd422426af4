"""Rotary frequencies: the default ones and the stretched ones of each rope scaling kind.

Each function follows transformers' (modeling_rope_utils.py) operation for operation, in
float32 as it computes them, so the tables the exported graph slices match the
reference's to the last bit where the arithmetic allows.
"""

from __future__ import annotations

import math

import torch

from attnserve.model.config import RopeScaling


def default_frequencies(dims: int, theta: float) -> torch.Tensor:
    """1 / theta^(2i / dims) for i < dims / 2: (dims / 2,) float32."""
    return 1.0 / (theta ** (torch.arange(0, dims, 2, dtype=torch.int64).float() / dims))


def frequencies(dims: int, theta: float, scaling: RopeScaling | None) -> tuple[torch.Tensor, float]:
    """The inverse frequencies (dims / 2,) and the factor cos and sin are multiplied by."""
    if scaling is None or scaling.kind == "dynamic":  # dynamic: default within its context
        return default_frequencies(dims, theta), 1.0
    return SCALINGS[scaling.kind](dims, theta, scaling), scaling.attention_factor


def _linear(dims: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    return default_frequencies(dims, theta) / scaling.factor


def _llama3(dims: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Wavelengths past original / low_freq_factor are stretched by factor, those under
    original / high_freq_factor kept, and the ones between interpolated smoothly."""
    inv_freq = default_frequencies(dims, theta)
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    original = scaling.original_max_seq_len
    assert original is not None
    wavelength = 2 * math.pi / inv_freq
    stretched = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * stretched / factor + smooth * stretched
    medium = ~(wavelength < original / high) * ~(wavelength > original / low)
    return torch.where(medium, smoothed, stretched)


def _yarn(dims: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Frequencies that turn more than beta_fast times over the original context are kept,
    those turning less than beta_slow times interpolated (/ factor), a linear ramp between."""
    original = scaling.original_max_seq_len
    assert original is not None

    def dim_turning(turns: float) -> float:  # the dim whose frequency turns this many times
        return (dims * math.log(original / (turns * 2 * math.pi))) / (2 * math.log(theta))

    low, high = dim_turning(scaling.beta_fast), dim_turning(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = ((torch.arange(dims // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp  # (dims / 2,): 1 where the original frequency stays
    powers = theta ** (torch.arange(0, dims, 2).float() / dims)
    return (1.0 / (scaling.factor * powers)) * (1 - kept) + (1.0 / powers) * kept


def _longrope(dims: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Within the original context: each default frequency divided by its short factor."""
    assert scaling.short_factor is not None  # as many as dims / 2: ModelConfig checks
    factors = torch.tensor(scaling.short_factor, dtype=torch.float32)
    shape = torch.arange(0, dims, 2, dtype=torch.int64).float() / dims
    return 1.0 / (factors * theta**shape)


SCALINGS = {"linear": _linear, "llama3": _llama3, "yarn": _yarn, "longrope": _longrope}
