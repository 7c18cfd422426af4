"""attnserve against TransformerLens 3.9's HookedTransformer, built from the same transformers
model with no weight processing (TransformerLens' own conversions, `run_with_cache`): every
hook point of the imported model holds what TransformerLens' site of that name holds, and
the served logit lens is TransformerLens' in both of its conventions."""

import pytest
import torch
from transformer_lens import patching

from attnserve.client import ClientOptions, EncoderClient
from attnserve.export.hf_import import load_hf
from attnserve.model.hook_points import captured
from attnserve.model.hooks import hook_names
from perf.transformer_lens_peer import hooked_transformer
from tests.conftest import ServerThread


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_every_site_equals_transformer_lens(families, family):
    directory, reference = families.checkpoint(family)
    model, _ = load_hf(directory, log=lambda _: None)
    lens = hooked_transformer(family, reference)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(3)
    )
    names = hook_names(model.config)
    with torch.no_grad(), captured(model, names) as ours:
        embeddings, _ = model(ids)
    with torch.no_grad():
        logits, cache = lens.run_with_cache(ids)
    torch.testing.assert_close(model.unembed(embeddings), logits, atol=1e-4, rtol=0)
    for name in names:
        if "hook_rot_" in name and model.config.positions != "rotary":
            assert name not in cache.cache_dict  # TransformerLens has them with rotary only
            continue
        if name.endswith("mlp.hook_in"):  # TransformerLens 4's name: 3.9 has no such site
            assert name not in cache.cache_dict
            layer = int(name.split(".")[1])
            with torch.no_grad():  # what 3.9's MLP reads: its ln2 of the stream before it
                want = lens.blocks[layer].ln2(cache[f"blocks.{layer}.hook_resid_mid"])
            torch.testing.assert_close(ours[name], want, atol=1e-5, rtol=1e-5, msg=name)
            continue
        torch.testing.assert_close(ours[name], cache[name], atol=1e-5, rtol=1e-5, msg=name)


def test_the_served_lens_is_transformer_lens_in_either_convention(families):
    """lens_norm frozen: apply_ln_to_stack(accumulated_resid(), recompute_ln=False); own:
    accumulated_resid(apply_ln=True) (TransformerLens >= 2.18). On a LayerNorm model the
    two differ."""
    family = "gpt2"
    _, reference = families.checkpoint(family)
    lens = hooked_transformer(family, reference)
    ids = torch.randint(0, lens.cfg.d_vocab, (1, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, cache = lens.run_with_cache(ids)
        stack = cache.accumulated_resid()  # (L+1, 1, T, D)
        # apply_ln_to_stack leaves the final norm's weight and bias to fold_ln (not done
        # here); accumulated_resid(apply_ln=True) runs ln_final itself, weight and bias too
        final = lens.ln_final
        frozen = cache.apply_ln_to_stack(stack, recompute_ln=False) * final.w + final.b
        own = cache.accumulated_resid(apply_ln=True)
        want = {k: x @ lens.W_U + lens.b_U for k, x in (("frozen", frozen), ("own", own))}
    server = ServerThread(families.exported(family))
    try:
        with EncoderClient(server.address, ClientOptions(timeout_s=60)) as client:
            for norm, logits in want.items():
                got = client.encode(
                    ids[0].tolist(), logit_lens={"logits": True, "lens_norm": norm}
                )[0].logit_lens
                torch.testing.assert_close(
                    torch.from_numpy(got.logits), logits[:, 0], atol=1e-4, rtol=1e-4, msg=norm
                )
    finally:
        server.stop()
    assert not torch.allclose(want["frozen"][:-1], want["own"][:-1], atol=1e-2)
    torch.testing.assert_close(want["frozen"][-1], want["own"][-1])  # the last reads alike


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_interventions_equal_transformer_lens_run_with_hooks(families, family):
    """Steering, setting a head's output and scaling an MLP's, as TransformerLens' forward
    hooks make them: the served logits within 1e-3 and the captured sites within 1e-4."""
    _, reference = families.checkpoint(family)
    lens = hooked_transformer(family, reference)
    cfg = lens.cfg
    ids = torch.randint(0, cfg.d_vocab, (1, 9), generator=torch.Generator().manual_seed(8))
    generator = torch.Generator().manual_seed(9)
    steer = torch.randn(cfg.d_model, generator=generator) * 4
    head = torch.randn(cfg.d_head, generator=generator)

    def add(x, hook):
        return x + 2.0 * steer

    def set_head(x, hook):  # (B, T, H, d_head)
        x = x.clone()
        x[:, [0, -1], 1] = head
        return x

    def scale(x, hook):
        return x * 0.25

    def halve_value_head(x, hook):  # (B, T, key/value heads, d_head)
        x = x.clone()
        x[:, :, 0] *= 0.5
        return x

    hooks = [
        ("blocks.1.hook_resid_pre", add),
        ("blocks.0.attn.hook_z", set_head),
        ("blocks.0.hook_mlp_out", scale),
        ("blocks.1.attn.hook_v", halve_value_head),
    ]
    captures = ["blocks.1.hook_resid_mid", "blocks.1.attn.hook_z", "blocks.1.hook_resid_post"]
    with torch.no_grad():
        logits = lens.run_with_hooks(ids, fwd_hooks=hooks)
        with lens.hooks(fwd_hooks=hooks):
            _, cache = lens.run_with_cache(ids, names_filter=captures)
    interventions = [
        {"hook": "blocks.1.hook_resid_pre", "op": "add", "values": steer.numpy(), "scale": 2.0},
        {"hook": "blocks.0.attn.hook_z", "op": "set", "values": head.numpy(), "heads": [1],
         "positions": [0, -1]},
        {"hook": "blocks.0.hook_mlp_out", "op": "scale", "scale": 0.25},
        {"hook": "blocks.1.attn.hook_v", "op": "scale", "scale": 0.5, "heads": [0]},
    ]  # fmt: skip
    server = ServerThread(families.exported(family))
    try:
        with EncoderClient(server.address, ClientOptions(timeout_s=60)) as client:
            got = client.encode(
                ids[0].tolist(),
                interventions=interventions,
                capture=captures,
                predictions={"logits": True},
            )[0]
    finally:
        server.stop()
    torch.testing.assert_close(
        torch.from_numpy(got.predictions.logits[0]), logits[0], atol=1e-3, rtol=0
    )
    for name in captures:
        torch.testing.assert_close(
            torch.from_numpy(got.activations[name]), cache[name][0], atol=1e-4, rtol=0, msg=name
        )


@pytest.mark.parametrize("family", ["gpt2", "llama", "gpt_neox"])
def test_patching_grids_equal_transformer_lens_patching(families, family):
    """The served patching grids of resid_pre ([layers, positions]) and z ([layers,
    heads]) are TransformerLens' get_act_patch_resid_pre and
    get_act_patch_attn_head_out_all_pos on the same pair of inputs."""
    _, reference = families.checkpoint(family)
    lens = hooked_transformer(family, reference)
    generator = torch.Generator().manual_seed(11)
    clean = torch.randint(0, lens.cfg.d_vocab, (1, 8), generator=generator)
    corrupted = clean.clone()
    corrupted[0, 2] = (clean[0, 2] + 1) % lens.cfg.d_vocab
    target, contrast = 3, 5

    def metric(logits):
        return logits[0, -1, target] - logits[0, -1, contrast]

    with torch.no_grad():
        _, cache = lens.run_with_cache(clean)
        want = {
            "resid_pre": patching.get_act_patch_resid_pre(lens, corrupted, cache, metric),
            "z": patching.get_act_patch_attn_head_out_all_pos(lens, corrupted, cache, metric),
        }
        ends = [metric(lens(tokens)) for tokens in (clean, corrupted)]
    server = ServerThread(families.exported(family))
    try:
        with EncoderClient(server.address, ClientOptions(timeout_s=120)) as client:
            for hook, grid in want.items():
                asked = {"source": clean[0].tolist(), "hook": hook, "target": target}
                got = client.encode(corrupted[0].tolist(), patching=asked | {"contrast": contrast})[
                    0
                ].patching
                assert got.hook == hook
                torch.testing.assert_close(
                    torch.from_numpy(got.values), grid, atol=1e-4, rtol=0, msg=hook
                )
                assert got.clean == pytest.approx(float(ends[0]), abs=1e-4)
                assert got.corrupted == pytest.approx(float(ends[1]), abs=1e-4)
    finally:
        server.stop()
