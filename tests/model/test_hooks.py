"""The hook points: every site named once, reached once, in TransformerLens' shapes; reads
see what a change made; a change moves what comes after it and nothing before."""

import pytest
import torch

from attnserve.model import hooks
from attnserve.model.artifacts import RESID_MID_NAME
from attnserve.model.config import ModelConfig
from attnserve.model.encoder import build_encoder
from attnserve.model.hook_points import captured, head_ablation, hook_points, hooked
from attnserve.model.hooks import hook_names
from attnserve.model.norms import NormSite
from attnserve.model.readout_sites import normed_site, stream_site
from tests.model.test_switches import CONFIGS

GPT2 = ModelConfig(n_layers=2, n_heads=4, d_model=32, d_ff=64, max_seq_len=32)
SITE_CONFIGS = {"gpt2": GPT2} | CONFIGS  # parallel GQA, sandwich, output and post norms
B, T = 2, 9


def ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(params=list(SITE_CONFIGS), ids=list(SITE_CONFIGS))
def model(request):
    return build_encoder(SITE_CONFIGS[request.param], seed=5)


def expected_shape(config: ModelConfig, name: str) -> tuple[int, ...]:
    site = name.rsplit(".", 1)[-1]
    H, H_kv, d_k = config.n_heads, config.kv_heads, config.head_dim
    return {
        "hook_q": (B, T, H, d_k),
        "hook_k": (B, T, H_kv, d_k),
        "hook_v": (B, T, H_kv, d_k),
        "hook_rot_q": (B, T, H, d_k),
        "hook_rot_k": (B, T, H_kv, d_k),
        "hook_pattern": (B, H, T, T),
        "hook_z": (B, T, H, d_k),
        "hook_scale": (B, T, 1),
    }.get(site, (B, T, config.d_model))


def test_every_site_is_named_once_and_reached_once_in_order(model):
    config = model.config
    names = hook_names(config)
    assert len(set(names)) == len(names)
    assert set(hook_points(model)) == set(names)
    reached: list[str] = []

    def note(name):
        return lambda x: reached.append(name)

    with torch.inference_mode(), hooked(model, {name: note(name) for name in names}):
        model(ids())
    assert reached == names  # once each, in the order hook_names gives
    with torch.inference_mode(), captured(model, names) as values:
        model(ids())
    for name in names:
        assert tuple(values[name].shape) == expected_shape(config, name), name
        # what an SAE on the site reads per position: its heads flattened
        width = None if name.endswith("hook_pattern") else values[name][0, 0].numel()
        assert hooks.site_width(config, name) == width, name


def test_the_stream_sites_are_the_stream(model):
    """x_0 is the embeddings (and positions) entering block 0; each block reads what the
    one before wrote; the last block's output before the final norm is a readable site,
    and the final norm of it is the model's output (where no projection follows)."""
    config = model.config
    L = config.n_layers
    with torch.inference_mode():
        stream, attentions = model.residual_stream(ids())
        names = [hooks.EMBED, hooks.RESID_POST.format(layer=L - 1)]
        if config.norm_placement != "post":
            names.append(hooks.FINAL_NORMALIZED)
        if config.positions == "learned":
            names.append(hooks.POS_EMBED)
        with captured(model, names) as values:
            embeddings, _ = model(ids())
        last = values[hooks.RESID_POST.format(layer=L - 1)]
    assert len(stream) == L + 1 and torch.equal(stream[-1], last)
    first = values[hooks.EMBED] + values.get(hooks.POS_EMBED, 0)
    assert torch.equal(stream[0], first)
    if config.norm_placement != "post":  # standardized before the norm's weight, as TL's
        normalized = values[hooks.FINAL_NORMALIZED]
        centred = last - last.mean(-1, keepdim=True) if config.norm == "layernorm" else last
        torch.testing.assert_close(
            normalized * centred.pow(2).mean(-1, keepdim=True).add(model.ln_f.eps).sqrt(),
            centred,
            atol=1e-5,
            rtol=1e-5,
        )
        with torch.inference_mode():
            normed, finished = model.ln_f(last), model.finish(last)
        torch.testing.assert_close(finished, embeddings, atol=1e-6, rtol=0)
        if config.d_embed is None:
            torch.testing.assert_close(embeddings, normed, atol=1e-5, rtol=0)
    pattern = hooks.PATTERN.format(layer=L - 1)
    with torch.inference_mode(), captured(model, [pattern]) as values:
        model(ids())
    assert torch.equal(values[pattern], attentions[:, -1])


def test_a_change_moves_what_follows_and_nothing_before(model):
    """Zeroing layer 1's stream as it enters changes its output and the model's, not what
    layer 0 read or wrote; a read after the change sees the changed value."""
    site = hooks.RESID_PRE.format(layer=1)
    before = [hooks.RESID_PRE.format(layer=0), hooks.RESID_POST.format(layer=0)]
    after = [site, hooks.RESID_POST.format(layer=1)]
    with torch.inference_mode():
        with captured(model, before + after) as plain:
            plain_out, _ = model(ids())
        with (
            hooked(model, {site: torch.zeros_like}),
            captured(model, before + after) as changed,
        ):
            changed_out, _ = model(ids())
    for name in before:
        assert torch.equal(changed[name], plain[name]), name
    assert torch.equal(changed[site], torch.zeros_like(plain[site]))
    assert not torch.allclose(changed[after[1]], plain[after[1]])
    assert not torch.allclose(changed_out, plain_out)


def test_head_ablation_scales_each_heads_slice_of_the_output_projections_input(model):
    """head_ablation on hook_z is what W_O reads with a head's slice scaled and moved."""
    config = model.config
    H, d_k = config.n_heads, config.head_dim
    mask = torch.ones(config.n_layers, H)
    mask[1, 0], mask[1, H - 1] = 0.0, 0.5
    means = torch.zeros(config.n_layers, H, d_k)
    means[1, 0] = torch.linspace(-1, 1, d_k)
    projection = model.blocks[1].attn.proj

    def by_hand(_module, args):
        (x,) = args  # (B, T, H * d_k)
        x = x.clone()
        x[..., :d_k] = means[1, 0]
        x[..., (H - 1) * d_k :] *= 0.5
        return (x,)

    with torch.inference_mode():
        handle = projection.register_forward_pre_hook(by_hand)
        try:
            want, want_attentions = model(ids())
        finally:
            handle.remove()
        with hooked(model, head_ablation(mask, means)):
            got, got_attentions = model(ids())
        plain, _ = model(ids())
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(got_attentions, want_attentions, atol=1e-6, rtol=0)
    assert not torch.allclose(got, plain)


def test_an_unknown_site_is_refused_by_name():
    model = build_encoder(GPT2)
    refused = pytest.raises(KeyError, match=r"no hook point 'blocks\.7\.hook_resid_pre'")
    with refused, hooked(model, {"blocks.7.hook_resid_pre": torch.zeros_like}):
        pass
    assert not any(point._forward_hooks for point in hook_points(model).values())


def test_hooks_are_removed_when_the_block_ends():
    model = build_encoder(GPT2)
    site = hooks.RESID_PRE.format(layer=1)
    with torch.inference_mode():
        plain, _ = model(ids())
        with hooked(model, {site: torch.zeros_like}):
            pass
        again, _ = model(ids())
    assert torch.equal(plain, again)
    assert not any(point._forward_hooks for point in hook_points(model).values())


def test_a_norm_split_at_its_sites_is_the_norm(model):
    """Hooking a norm's sites runs it in three steps (model/layers.py through_sites), with
    the output of its one op (their values are TransformerLens': tests/export/
    test_transformer_lens.py)."""
    names = [n for n in hook_names(model.config) if n.endswith((hooks.SCALE, hooks.NORMALIZED))]
    assert names  # every family's blocks have norms
    with torch.inference_mode():
        plain, _ = model(ids())
        with captured(model, names) as values:
            split, _ = model(ids())
    torch.testing.assert_close(split, plain, atol=1e-5, rtol=1e-5)
    assert all(bool((values[n] > 0).all()) for n in names if n.endswith(hooks.SCALE))


def test_the_norms_sites_an_sae_reads_are_computed_from_the_stream(model):
    """What an SAE on a norm's site is fed (model/readout_sites.py normed_site, export/
    sae_site.py): NormSite of that norm on the site it reads is the site; an MLP reading
    the stream unnormed reads hook_resid_mid. Every MLP's input is one or the other."""
    config = model.config
    names = hook_names(config)
    with torch.inference_mode(), captured(model, names) as values:
        model(ids())
    computed, mlp_inputs = set(), set()
    for name in names:
        site = normed_site(config, name)
        if site is not None:
            norm = NormSite(model.get_submodule(site.norm), site.weighted)
            with torch.inference_mode():
                got = norm(values[site.source])
            torch.testing.assert_close(got, values[name], atol=1e-5, rtol=1e-5, msg=name)
            computed.add(name)
        elif name.endswith("mlp.hook_in"):
            layer = int(name.split(".")[1])
            assert stream_site(config, name) == (RESID_MID_NAME, layer), name
            assert torch.equal(values[name], values[hooks.RESID_MID.format(layer=layer)])
        if name.endswith("mlp.hook_in"):
            mlp_inputs.add(name)
    assert len(mlp_inputs) == config.n_layers
    if config.norm_placement in ("pre", "sandwich"):
        assert mlp_inputs < computed  # and each norm's standardized x
