"""TransformerLens 3.x's HookedTransformer of a transformers model: the reference the tests
hold attnserve's readouts, interventions and patching to, and the peer `python -m perf
interventions` times (TransformerLens' own weight conversions, no weight processing)."""

from __future__ import annotations

import transformer_lens
from transformer_lens.pretrained import weight_conversions


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
    elif family == "gpt_neox":  # attention and MLP side by side, rotary on a quarter
        d_head = hf.hidden_size // hf.num_attention_heads
        config = transformer_lens.HookedTransformerConfig(
            **common,
            d_head=d_head,
            d_mlp=hf.intermediate_size,
            act_fn="gelu",
            normalization_type="LN",
            eps=hf.layer_norm_eps,
            positional_embedding_type="rotary",
            rotary_dim=int(d_head * hf.rope_parameters["partial_rotary_factor"]),
            rotary_base=hf.rope_parameters["rope_theta"],
            rotary_adjacent_pairs=False,
            parallel_attn_mlp=True,
            original_architecture="GPTNeoXForCausalLM",
        )
        state = weight_conversions.convert_neox_weights(reference, config)
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
