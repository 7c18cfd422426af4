"""The replacement model's backward (model/replacement.py) against circuit-tracer's way of
computing the same rows: the real model run on the prompt with torch's autograd, its
patterns, norm scales and MLP outputs detached there (a transcoder's skip kept), the
gradient put at each row's site. Every family's layout: LayerNorm and learned positions,
a parallel GQA block, Gemma's sandwich norms and soft-caps, OLMo 2's output norms with
Granite's scales, post-norm blocks; with and without skip connections; at activations of
trained models' scale (an outlier dimension in the thousands)."""

import pytest
import torch

from attnserve.model import hooks
from attnserve.model.config import ModelConfig
from attnserve.model.encoder import Encoder, build_encoder
from attnserve.model.hook_points import Hook, hooked
from attnserve.model.replacement import Transcoders, backward, freeze, scale_sites
from tests.model.test_switches import CONFIGS

FAMILIES = {
    "gpt2": ModelConfig(n_layers=3, n_heads=4, d_model=32, d_ff=64, max_seq_len=32),
    **{name: config for name, config in CONFIGS.items() if config.d_embed is None},
    "post": ModelConfig(**{**CONFIGS["post"].to_dict(), "d_embed": None}),
}
T, N = 9, 6


def trained_scale(model: Encoder) -> Encoder:
    """Weights of trained models' scale: larger than the init's, and one dimension of the
    token embeddings in the thousands (the outliers of trained residual streams)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "weight" in name and p.dim() == 2:
                p.normal_(0, 0.2, generator=generator)
        model.tok_emb.weight[:, 3] = 2000.0
    return model


def reference(model, ids, transcoders, grads, layers, positions):
    """circuit-tracer's rows: autograd through the real run with the frozen parts detached."""
    L = model.config.n_layers
    reached: dict[int, torch.Tensor] = {}
    read: dict[str, torch.Tensor] = {}

    def keep(layer: int) -> Hook:
        return lambda x: reached.__setitem__(layer, x)

    def detached_but_skip(layer: int) -> Hook:
        def hook(m: torch.Tensor) -> torch.Tensor:
            skip = transcoders.skips[layer]
            s = 0 * m if skip is None else reached[layer] @ skip.T
            read[hooks.MLP_OUT.format(layer=layer)] = out = s + (m - s).detach()
            return out

        return hook

    def embed(x: torch.Tensor) -> None:
        read[hooks.EMBED] = x

    detach: dict[str, Hook] = {name: torch.Tensor.detach for name in scale_sites(model)}
    detach |= {hooks.PATTERN.format(layer=i): torch.Tensor.detach for i in range(L)}
    detach |= {transcoders.input_site.format(layer=i): keep(i) for i in range(L)}
    detach |= {hooks.MLP_OUT.format(layer=i): detached_but_skip(i) for i in range(L)}
    detach[hooks.EMBED] = embed
    with hooked(model, detach):
        output, _ = model(ids.expand(len(grads), -1))
    sites = [*(reached[i] for i in range(L)), output]
    at = torch.nn.functional.one_hot(positions, ids.shape[1]).float()
    objective = sum(
        ((site * grads[:, None]).sum(-1) * at * (layers == i)[:, None]).sum()
        for i, site in enumerate(sites)
    )
    names = [hooks.MLP_OUT.format(layer=i) for i in range(L)] + [hooks.EMBED]
    got = torch.autograd.grad(objective, [read[n] for n in names], allow_unused=True)
    got = [torch.zeros_like(read[n]) if g is None else g for g, n in zip(got, names, strict=True)]
    return torch.stack(got[:L], dim=1), got[L]


def rows(config: ModelConfig, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    grads = torch.randn(N, config.d_model, generator=generator)
    layers = torch.randint(0, config.n_layers + 1, (N,), generator=generator)
    layers[:2] = torch.tensor([0, config.n_layers])  # the first layer's and a logit's
    positions = torch.randint(0, T, (N,), generator=generator)
    return grads, layers, positions


def transcoder_set(config: ModelConfig, skip: bool) -> Transcoders:
    site = hooks.RESID_MID if config.residual == "sequential" else hooks.RESID_PRE
    generator = torch.Generator().manual_seed(4)
    D = config.d_model
    skips = [torch.randn(D, D, generator=generator) / D**0.5 if skip else None
             for _ in range(config.n_layers)]  # fmt: skip
    return Transcoders(site, skips)


@pytest.mark.parametrize("skip", [False, True], ids=["plain", "skip"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_backward_is_circuit_tracers_rows(family, skip):
    model = trained_scale(build_encoder(FAMILIES[family], seed=3))
    config = model.config
    ids = torch.randint(3, 200, (1, T), generator=torch.Generator().manual_seed(7))
    transcoders = transcoder_set(config, skip)
    grads, layers, positions = rows(config)
    frozen = freeze(model, ids, transcoders.input_site)
    with torch.no_grad():
        mlp, embed = backward(model, frozen, transcoders, grads, layers, positions)
    want_mlp, want_embed = reference(model, ids, transcoders, grads, layers, positions)
    for got, want in ((mlp, want_mlp), (embed, want_embed)):
        scale = want.flatten(1).abs().amax(1).clamp(min=1e-30)[:, *[None] * (want.dim() - 1)]
        torch.testing.assert_close(got / scale, want / scale, atol=1e-5, rtol=0)
    assert embed[1].abs().amax() > 0  # a logit's row reaches the tokens
