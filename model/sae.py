"""A sparse autoencoder over one hook site, as SAELens runs one at inference, and what a
researcher reads of it per token: its features' activations, how many fire (L0), and what
the SAE fails to reconstruct.

SAELens' `SAE.encode` for the architectures served here (shapes: B batch, T positions, D
the site's width `d_in`, S the SAE's width `d_sae`):

    x' = normalize(x) - b_dec * apply_b_dec_to_input      # (B, T, D)
    pre = x' @ W_enc + b_enc                              # (B, T, S)
    standard: acts = relu(pre)
    jumprelu: acts = relu(pre) * (pre > threshold)
    topk:     acts = relu of the k largest of pre, 0 elsewhere
    gated:    acts = relu(x' @ (W_enc * exp(r_mag)) + b_mag) * (x' @ W_enc + b_gate > 0)

and the reconstruction `denormalize(acts @ W_dec + b_dec)`. A transcoder (SAELens'
Transcoder, SkipTranscoder and JumpReLU ones; circuit-tracer's per-layer transcoders)
reconstructs another site, E wide: W_dec (S, E), b_dec (E), plus `x @ W_skip.T` with a
skip connection (W_skip (E, D)); it neither normalizes its input nor subtracts b_dec from
it, and its error is measured against that other site's values. SAEConfig
(model/sae_config.py) is plain data (an SAE directory's sae.json holds it); export/sae.py
traces the module to ONNX.
"""

from __future__ import annotations

import torch
from torch import nn

from attnserve.model.sae_config import SAEConfig

LAYER_NORM_EPS = 1e-5  # SAELens' run-time layer norm, added to the standard deviation


class SparseAutoencoder(nn.Module):
    """One SAE; forward(x) returns what it reads of each position."""

    def __init__(self, config: SAEConfig) -> None:
        super().__init__()
        if config.transcoder and (
            config.apply_b_dec_to_input or config.normalize_activations != "none"
        ):
            raise ValueError(
                "a transcoder's b_dec is of its output site: it neither subtracts it from its "
                "input nor normalizes that input"
            )
        self.config = config
        d, s, e = config.d_in, config.d_sae, config.width_out
        self.W_enc = nn.Parameter(torch.empty(d, s))
        if config.architecture == "gated":  # a gate and a magnitude share W_enc
            self.b_gate = nn.Parameter(torch.empty(s))
            self.r_mag = nn.Parameter(torch.empty(s))  # the magnitude's W_enc * exp(r_mag)
            self.b_mag = nn.Parameter(torch.empty(s))
        else:
            self.b_enc = nn.Parameter(torch.empty(s))
        self.W_dec = nn.Parameter(torch.empty(s, e))
        self.b_dec = nn.Parameter(torch.empty(e))
        if config.skip:
            self.W_skip = nn.Parameter(torch.empty(e, d))
        if config.architecture == "jumprelu":
            self.threshold = nn.Parameter(torch.empty(s))

    def normalize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x rescaled as the SAE was trained on it, and (scale, shift) that undo it:
        x = x' * scale + shift."""
        ones, zeros = torch.ones_like(x[..., :1]), torch.zeros_like(x[..., :1])
        kind = self.config.normalize_activations
        if kind == "constant_norm_rescale":  # every position at norm sqrt(D)
            scale = x.norm(dim=-1, keepdim=True) / self.config.d_in**0.5  # (B, T, 1)
            return x / scale, scale, zeros
        if kind == "layer_norm":  # torch's std: unbiased, as SAELens'
            mean = x.mean(dim=-1, keepdim=True)
            std = (x - mean).std(dim=-1, keepdim=True)
            return (x - mean) / (std + LAYER_NORM_EPS), std, mean
        return x, ones, zeros

    def sae_in(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D) as the encoder reads it, and (scale, shift) of normalize."""
        normed, scale, shift = self.normalize(x)
        if self.config.apply_b_dec_to_input:
            normed = normed - self.b_dec
        return normed, scale, shift

    def pre_activations(self, sae_in: torch.Tensor) -> torch.Tensor:
        """The encoder's pre-activations (B, T, S) (a gated SAE's magnitudes')."""
        if self.config.architecture == "gated":
            return sae_in @ (self.W_enc * self.r_mag.exp()) + self.b_mag
        return sae_in @ self.W_enc + self.b_enc

    def forward(
        self, x: torch.Tensor, target: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, D) -> (L0 (B, T), the reconstruction error's norm (B, T), the
        activations (B, T, S)); a transcoder's error is against `target` (B, T, E), its
        output site's values. The strongest features are the activations' top k
        (export/sae.py appends them to the graph, k an input)."""
        sae_in, scale, shift = self.sae_in(x)
        acts = self.activate(self.pre_activations(sae_in), sae_in)  # (B, T, S)
        l0 = (acts > 0).sum(dim=-1)  # (B, T)
        reconstruction = self.decode(acts, x) * scale + shift  # (B, T, E)
        against = x if target is None else target
        return l0, (against - reconstruction).norm(dim=-1), acts

    def decode(self, acts: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """What the activations (B, T, S) write at the decoder's site (B, T, E), before
        denormalizing; a skip connection adds x's (B, T, D) share."""
        decoded = acts
        if self.config.rescale_acts_by_decoder_norm:  # ranked in units of W_dec's norms
            decoded = acts / self.W_dec.norm(dim=-1)
        out = decoded @ self.W_dec + self.b_dec
        if self.config.skip:
            out = out + x @ self.W_skip.T
        return out

    def activate(self, pre: torch.Tensor, sae_in: torch.Tensor) -> torch.Tensor:
        """The architecture's activation of the pre-activations (B, T, S)."""
        if self.config.architecture == "jumprelu":
            return torch.relu(pre) * (pre > self.threshold)
        if self.config.architecture == "gated":  # on where the gate opens
            return torch.relu(pre) * (self.gate(sae_in) > 0)
        if self.config.architecture == "topk":
            ranked = self.ranked(pre)
            values, ids = ranked.topk(self.config.k, dim=-1)  # (B, T, k)
            return torch.zeros_like(ranked).scatter(-1, ids, torch.relu(values))
        return torch.relu(pre)

    def gate(self, sae_in: torch.Tensor) -> torch.Tensor:
        """A gated SAE's gate pre-activations (B, T, S): a feature is on where positive."""
        return sae_in @ self.W_enc + self.b_gate

    def ranked(self, pre: torch.Tensor) -> torch.Tensor:
        """What a top-k SAE ranks its features by (B, T, S)."""
        if self.config.rescale_acts_by_decoder_norm:
            return pre * self.W_dec.norm(dim=-1)
        return pre

    def distance_to_switch(self, x: torch.Tensor) -> torch.Tensor:
        """How far each feature at x (B, T, D) is from switching on or off (B, T, S): its
        pre-activation from 0 (the ReLU), from the threshold (jumprelu), from midway
        between the k-th largest and the next (topk, and from 0), its gate from 0 (gated,
        and its magnitude from 0). A rounding's worth from it, two correct implementations
        may disagree (on L0; the activation there is as small as that distance, or jumps)."""
        sae_in = self.sae_in(x)[0]
        pre = self.pre_activations(sae_in)
        if self.config.architecture == "gated":
            return torch.minimum(self.gate(sae_in).abs(), pre.abs())
        if self.config.architecture == "jumprelu":
            return (pre - self.threshold).abs()
        if self.config.architecture == "topk" and self.config.k < self.config.d_sae:
            ranked = self.ranked(pre)
            values = ranked.topk(self.config.k + 1, dim=-1).values  # (B, T, k + 1)
            between = (values[..., -2:-1] + values[..., -1:]) / 2  # the k-th and the next
            return torch.minimum((ranked - between).abs(), pre.abs())
        return pre.abs()
