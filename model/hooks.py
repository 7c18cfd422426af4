"""The sites of the model a researcher reads or changes, named as TransformerLens names them.

Torch-free: the service validates the names a request sends against `hook_names(config)`;
the model (model/hook_points.py) gives each of its HookPoint modules one of these names.
Shapes are TransformerLens' too: B batch, T positions, D d_model, H query heads, H_kv
key/value heads, d_k head_dim.
"""

from __future__ import annotations

from attnserve.model.config import ModelConfig

EMBED = "hook_embed"  # (B, T, D) token embeddings as they enter the stream (scaled, projected)
POS_EMBED = "hook_pos_embed"  # (B, T, D) the learned position table's rows (GPT-2, OPT)
RESID_PRE = "blocks.{layer}.hook_resid_pre"  # (B, T, D) what the block reads
ATTN_OUT = "blocks.{layer}.hook_attn_out"  # (B, T, D) what attention writes (Granite: unscaled)
RESID_MID = "blocks.{layer}.hook_resid_mid"  # (B, T, D) between attention and MLP (sequential)
MLP_OUT = "blocks.{layer}.hook_mlp_out"  # (B, T, D) what the MLP writes (Granite: unscaled)
RESID_POST = "blocks.{layer}.hook_resid_post"  # (B, T, D) what the block writes
Q = "blocks.{layer}.attn.hook_q"  # (B, T, H, d_k) queries, before per-head norms and rotation
K = "blocks.{layer}.attn.hook_k"  # (B, T, H_kv, d_k) keys, likewise
V = "blocks.{layer}.attn.hook_v"  # (B, T, H_kv, d_k) values
# (B, T, H, d_k) and (B, T, H_kv, d_k): queries and keys as the scores read them, after the
# per-head norms and the rotation (TransformerLens names them so in rotary models; here every
# model has them: without rotary positions they equal the normed hook_q and hook_k)
ROT_Q = "blocks.{layer}.attn.hook_rot_q"
ROT_K = "blocks.{layer}.attn.hook_rot_k"
PATTERN = "blocks.{layer}.attn.hook_pattern"  # (B, H, T, T) attention weights (query rows)
Z = "blocks.{layer}.attn.hook_z"  # (B, T, H, d_k) each head's output, before W_O
# Each norm's two sites, as TransformerLens names them: what it divides by, (B, T, 1)
# (hook_scale: sqrt(var + eps) or sqrt(mean x^2 + eps)), and x standardized by it, before
# the norm's weight (hook_normalized, (B, T, D)). Freezing hook_scale at a prompt's value
# makes the norm linear (circuit tracing; the logit lens). The norms: each block's ln1 and
# ln2 (before the sublayers, or after the adds in post-norm blocks), ln1_post and ln2_post
# (a sublayer's output: sandwich and output placements) and the final ln_final.
SCALE, NORMALIZED = "hook_scale", "hook_normalized"
LN1, LN2 = "blocks.{layer}.ln1", "blocks.{layer}.ln2"
LN1_POST, LN2_POST = "blocks.{layer}.ln1_post", "blocks.{layer}.ln2_post"
LN_FINAL = "ln_final"
FINAL_NORMALIZED = f"{LN_FINAL}.{NORMALIZED}"  # (B, T, D) the final norm's standardized x
MLP_IN = "blocks.{layer}.mlp.hook_in"  # (B, T, D) what the MLP reads (after ln2 and its weight)

ATTENTION_SITES = (Q, K, V, ROT_Q, ROT_K, PATTERN, Z)

# The sites a request may change (interventions), by the short name the readouts graph's
# inputs for them carry, in the order a block reaches them: the stream and what each
# sublayer writes, each (B, T, D), and per head the queries, keys, values and outputs.
CHANGEABLE = {
    "resid_pre": RESID_PRE,
    "q": Q,
    "k": K,
    "v": V,
    "z": Z,
    "attn_out": ATTN_OUT,
    "resid_mid": RESID_MID,
    "mlp_out": MLP_OUT,
    "resid_post": RESID_POST,
}


def norm_sites(norm: str) -> list[str]:
    """A norm's two sites, in the order it reaches them (model/norms.py through_sites)."""
    return [f"{norm}.{SCALE}", f"{norm}.{NORMALIZED}"]


def block_sites(config: ModelConfig) -> list[str]:
    """A block's sites, "{layer}" unfilled, in the order its forward reaches them: the
    stream, each norm's, attention's, the MLP's input and what each sublayer writes, by the
    residual layout and the norm placement (model/layers.py Block)."""
    placement, residual = config.norm_placement, config.residual
    attention, mlp = list(ATTENTION_SITES), [MLP_IN]
    if residual != "sequential":  # attention and the MLP read the block's input
        second = [] if residual == "parallel_one_norm" else norm_sites(LN2)
        return [RESID_PRE, *norm_sites(LN1), *attention, *second, *mlp, ATTN_OUT, MLP_OUT,
                RESID_POST]  # fmt: skip
    if placement == "post":  # norm(x + f(x))
        first, second = [*attention, ATTN_OUT, *norm_sites(LN1)], [*mlp, MLP_OUT, *norm_sites(LN2)]
    else:
        before = placement != "output"
        after = placement in ("sandwich", "output")
        first = [*(norm_sites(LN1) if before else []), *attention]
        first += [*(norm_sites(LN1_POST) if after else []), ATTN_OUT]
        second = [*(norm_sites(LN2) if before else []), *mlp]
        second += [*(norm_sites(LN2_POST) if after else []), MLP_OUT]
    return [RESID_PRE, *first, RESID_MID, *second, RESID_POST]


def hook_names(config: ModelConfig) -> list[str]:
    """Every site of a model of `config`, in the order a forward pass reaches them.
    hook_pattern is reached only where the weights are computed (not by the fused kernel's
    graphs); hook_resid_mid only in sequential blocks (a parallel block's attention and MLP
    read the same input); ln_final only where the model has a final norm."""
    names = [EMBED]
    if config.positions == "learned":
        names.append(POS_EMBED)
    sites = block_sites(config)
    for layer in range(config.n_layers):
        names += [site.format(layer=layer) for site in sites]
    if config.norm_placement != "post":  # post-norm blocks end normed already
        names += norm_sites(LN_FINAL)
    return names


def changeable(config: ModelConfig) -> dict[str, str]:
    """CHANGEABLE for a model of `config`: hook_resid_mid only in sequential blocks."""
    sequential = config.residual == "sequential"
    return {kind: site for kind, site in CHANGEABLE.items() if sequential or site != RESID_MID}


def kind_heads(config: ModelConfig, kind: str) -> int | None:
    """How many heads a site of `kind` (CHANGEABLE) holds side by side, each head_dim wide
    (keys and values: the key/value heads); None for the (B, T, D) sites."""
    return {
        "q": config.n_heads,
        "z": config.n_heads,
        "k": config.kv_heads,
        "v": config.kv_heads,
    }.get(kind)


def parse_site(name: str, config: ModelConfig) -> tuple[str, int] | None:
    """(kind, layer) of a changeable site's hook name (blocks.3.hook_resid_pre ->
    ("resid_pre", 3)); None for any other name."""
    for kind, site in changeable(config).items():
        for layer in range(config.n_layers):
            if name == site.format(layer=layer):
                return kind, layer
    return None


def site_width(config: ModelConfig, name: str) -> int | None:
    """The width of one position at site `name`, its heads flattened (hook_z's H x d_k, as
    SAELens' hook_z SAEs read it); None for hook_pattern, whose width is the text's length.
    The name must be one of hook_names(config)."""
    heads, kv_heads = config.n_heads * config.head_dim, config.kv_heads * config.head_dim
    if name.endswith(SCALE):
        return 1
    widths = {PATTERN: None, Q: heads, ROT_Q: heads, Z: heads}
    widths |= {K: kv_heads, ROT_K: kv_heads, V: kv_heads}
    for site, width in widths.items():
        if name.endswith(site.split("}", 1)[1]):  # ".attn.hook_q" after "blocks.{layer}"
            return width
    return config.d_model
