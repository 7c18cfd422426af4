"""Where the readouts graph returns each hook site (model/artifacts.py names its outputs), and
how a norm computes the sites it does not return from those it does.

Torch-free on purpose: the service finds the sites a request reads with it.
"""

from dataclasses import dataclass

from attnserve.model import hooks
from attnserve.model.artifacts import (
    ATTN_OUTPUTS_NAME,
    PARTS_NAMES,
    RESID_MID_NAME,
    RESIDUAL_STREAM_NAME,
)
from attnserve.model.config import ModelConfig


def readout_sites(config: ModelConfig) -> dict[str, list[str]]:
    """The readouts graph's outputs beside forward's: each is its hook points' values
    stacked on axis 1 (a hook_z's heads side by side): the residual stream x_0 .. x_L (every
    block's input, then the last block's output, before the final norm), its parts, what
    attention writes and (sequential blocks) the stream between attention and MLP.
    Directories written before 2026-11-28 lack the last two (their SAEs are refused)."""
    layers = range(config.n_layers)
    sites = {
        RESIDUAL_STREAM_NAME: [
            *(hooks.RESID_PRE.format(layer=layer) for layer in layers),
            hooks.RESID_POST.format(layer=config.n_layers - 1),
        ],
        PARTS_NAMES[0]: [hooks.Z.format(layer=layer) for layer in layers],
        PARTS_NAMES[1]: [hooks.MLP_OUT.format(layer=layer) for layer in layers],
        ATTN_OUTPUTS_NAME: [hooks.ATTN_OUT.format(layer=layer) for layer in layers],
    }
    if config.residual == "sequential":
        sites[RESID_MID_NAME] = [hooks.RESID_MID.format(layer=layer) for layer in layers]
    return sites


def stream_site(config: ModelConfig, name: str) -> tuple[str, int] | None:
    """Where the readouts graph returns hook site `name`: (its output, the index on axis 1),
    or None for a site it does not return. A block's hook_resid_post is the next block's
    hook_resid_pre: the same values, one row of the residual stream."""
    for output, names in readout_sites(config).items():
        if name in names:
            return output, names.index(name)
    for layer in range(config.n_layers - 1):
        if name == hooks.RESID_POST.format(layer=layer):
            return RESIDUAL_STREAM_NAME, layer + 1
    # an MLP that reads the stream unnormed (output and post norms) reads hook_resid_mid
    if config.norm_placement in ("output", "post") and config.residual == "sequential":
        for layer in range(config.n_layers):
            if name == hooks.MLP_IN.format(layer=layer):
                return RESID_MID_NAME, layer
    return None


@dataclass(frozen=True)
class NormedSite:
    """A site the readouts graph does not return that a norm computes from one it does
    (Gemma Scope's transcoders read ln2.hook_normalized, Llama's mlp.hook_in): an SAE there
    is fed its own small graph of that norm (saes/NAME/site.onnx, export/sae_site.py)."""

    source: str  # the site the norm reads, which stream_site finds
    norm: str  # the norm's module in the encoder: blocks.3.ln2, ln_f
    weighted: bool  # the norm's output (mlp.hook_in), or x standardized (hook_normalized)


def normed_site(config: ModelConfig, name: str) -> NormedSite | None:
    """How a norm computes site `name` from a site the readouts graph returns; None where
    none does (stream_site returns it, or no norm reads a returned site: a sequential
    post-norm block's norms read sums, an output norm what its sublayer computes)."""
    if name == hooks.FINAL_NORMALIZED:
        last = hooks.RESID_POST.format(layer=config.n_layers - 1)
        return NormedSite(last, "ln_f", False) if config.norm_placement != "post" else None
    sequential, one_norm = config.residual == "sequential", config.residual == "parallel_one_norm"
    if sequential and config.norm_placement not in ("pre", "sandwich"):
        return None  # (a parallel block's norms read its input whatever their placement)
    for layer in range(config.n_layers):
        ln1, ln2 = hooks.LN1.format(layer=layer), hooks.LN2.format(layer=layer)  # modules too
        before_mlp = (hooks.RESID_MID if sequential else hooks.RESID_PRE).format(layer=layer)
        sites = {
            f"{ln1}.{hooks.NORMALIZED}": NormedSite(
                hooks.RESID_PRE.format(layer=layer), ln1, False
            ),
            f"{ln2}.{hooks.NORMALIZED}": NormedSite(before_mlp, ln2, False),
            hooks.MLP_IN.format(layer=layer): NormedSite(
                before_mlp, ln1 if one_norm else ln2, True
            ),
        }
        if one_norm:  # its MLP reads ln1's output: it has no ln2
            del sites[f"{ln2}.{hooks.NORMALIZED}"]
        if name in sites:
            return sites[name]
    return None
