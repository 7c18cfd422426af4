"""attnserve against TransformerLens 3.9's HookedTransformer, built from the same transformers
model with no weight processing (TransformerLens' own conversions, `run_with_cache`): every
hook point of the imported model holds what TransformerLens' site of that name holds, and
the served logit lens is TransformerLens' in both of its conventions."""

import pytest
import torch
import transformer_lens
from transformer_lens.pretrained import weight_conversions

from attnserve.client import ClientOptions, EncoderClient
from attnserve.export.hf_import import load_hf
from attnserve.model.hook_points import captured
from attnserve.model.hooks import hook_names
from tests.conftest import ServerThread


def hooked_transformer(family: str, reference) -> transformer_lens.HookedTransformer:
    """`reference` (transformers) as TransformerLens' HookedTransformer, unprocessed."""
    hf = reference.config
    common = dict(
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        n_heads=hf.num_attention_heads,
        d_vocab=hf.vocab_size,
        n_ctx=hf.max_position_embeddings,
        default_prepend_bos=False,
        device="cpu",
    )
    if family == "gpt2":
        config = transformer_lens.HookedTransformerConfig(
            **common,
            d_head=hf.hidden_size // hf.num_attention_heads,
            d_mlp=4 * hf.hidden_size,
            act_fn="gelu_new",
            normalization_type="LN",
            eps=hf.layer_norm_epsilon,
            original_architecture="GPT2LMHeadModel",
        )
        state = weight_conversions.convert_gpt2_weights(reference, config)
    else:
        config = transformer_lens.HookedTransformerConfig(
            **common,
            d_head=hf.head_dim,
            n_key_value_heads=hf.num_key_value_heads,
            d_mlp=hf.intermediate_size,
            act_fn="silu",
            normalization_type="RMS",
            eps=hf.rms_norm_eps,
            positional_embedding_type="rotary",
            rotary_dim=hf.head_dim,
            rotary_base=hf.rope_parameters["rope_theta"],
            rotary_adjacent_pairs=False,
            final_rms=True,
            gated_mlp=True,
            original_architecture="LlamaForCausalLM",
        )
        state = weight_conversions.convert_llama_weights(reference, config)
    model = transformer_lens.HookedTransformer(config)
    model.load_state_dict(state, strict=False)
    return model.eval()


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
