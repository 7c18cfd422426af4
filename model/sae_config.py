"""A sparse autoencoder's config as plain data: what an SAE directory's sae.json holds and
what the service reads of it (torch-free: the service imports it; model/sae.py runs it).

A transcoder is an SAE whose decoder writes another site than the one its encoder reads
(an MLP's output from the stream before it): `hook_name_out` names that site, `d_out` its
width, and `skip` says it adds a linear skip of its input (x @ W_skip.T). Its features are
read off its input site, its reconstruction error measured against its output site."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

ARCHITECTURES = ("standard", "jumprelu", "topk", "gated")
# expected_average_only_in: SAELens folds the dataset's scale into the weights where it
# knows it and otherwise runs the SAE on x unscaled, as this does.
NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")


@dataclass(frozen=True)
class SAEConfig:
    architecture: str  # one of ARCHITECTURES
    d_in: int  # the site's width per position (D)
    d_sae: int  # the number of features (S)
    hook_name: str  # the site it reads, TransformerLens' name (model/hooks.py)
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"  # one of NORMALIZATIONS
    k: int = 0  # topk: the features kept per position
    rescale_acts_by_decoder_norm: bool = False  # topk: rank pre * |W_dec row|
    hook_name_out: str = ""  # a transcoder's output site ("": an SAE, its own site)
    d_out: int = 0  # that site's width (0: d_in)
    skip: bool = False  # a transcoder's skip connection, W_skip (d_out, d_in)

    @property
    def transcoder(self) -> bool:
        return bool(self.hook_name_out) and self.hook_name_out != self.hook_name

    @property
    def output_hook(self) -> str:
        """The site the decoder reconstructs (an SAE's own)."""
        return self.hook_name_out or self.hook_name

    @property
    def width_out(self) -> int:
        return self.d_out or self.d_in

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SAEConfig:
        """The config of `values` (sae.json's "config"), keys it does not know ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})
