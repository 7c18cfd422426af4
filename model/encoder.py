"""The encoder: token embeddings, positions (a learned table or rotary), N blocks, a final
norm; and what reads its residual stream: the unembedding (next-token logits), the logit
lens and direct logit attribution."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from attnserve.model.config import ModelConfig
from attnserve.model.hook_points import HookPoint, captured
from attnserve.model.hooks import EMBED, LN_FINAL, POS_EMBED, RESID_POST, RESID_PRE
from attnserve.model.layers import Block, KVCache, Rotary
from attnserve.model.norms import RMSNorm, frozen_linear, frozen_norm, make_norm, norm_scale


class Encoder(nn.Module):
    rotary: Rotary  # rotary positions: the tables of every layer (or of the global ones)
    sliding_rotary: Rotary  # ... and of the sliding layers, where they have their own

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.embedding_dim)
        if config.d_embed is not None:  # OPT-350m: narrower token embeddings, projected
            self.embed_in = nn.Linear(config.d_embed, config.d_model, bias=False)
            self.embed_out = nn.Linear(config.d_model, config.d_embed, bias=False)
        if config.positions == "learned":
            self.pos_emb = nn.Embedding(config.max_seq_len, config.d_model)
        else:
            for name, rotary in rotary_modules(config).items():
                setattr(self, name, rotary)
        self.hook_embed = HookPoint(EMBED)
        if config.positions == "learned":
            self.hook_pos_embed = HookPoint(POS_EMBED)
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.n_layers))
        if config.norm_placement != "post":  # post-norm blocks end normed already
            # TransformerLens' name: its final norm is ln_final (ours keeps GPT-2's ln_f)
            self.ln_f = make_norm(config, name=LN_FINAL)
        if config.unembedding == "separate":  # else the token table is the unembedding
            bias = config.unembedding_bias
            self.lm_head = nn.Linear(config.embedding_dim, config.vocab_size, bias=bias)
        self.apply(_init_weights)

    def forward(
        self, input_ids: torch.Tensor, need_weights: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids (B, T) int64 -> embeddings (B, T, D), attentions (B, L, H, T, T).

        H counts query heads, also under grouped-query attention. With
        need_weights=False the attentions are None and every layer uses the fused
        attention kernel instead (same embeddings, less memory traffic). What a
        researcher reads or changes on the way (the residual stream, each head's output,
        a head removed) goes through the hook points (model/hook_points.py).
        """
        T = input_ids.size(1)
        if self.config.max_seq_len < T:
            raise ValueError(f"sequence length {T} exceeds max_seq_len {self.config.max_seq_len}")
        x = self.embed(input_ids, torch.arange(T, device=input_ids.device))  # (B, T, D)
        x, attentions = self.run_blocks(x, need_weights)
        embeddings = self.finish(x)
        if not need_weights:
            return embeddings, None
        # every block's weights, need_weights: (B, L, H, T, T)
        return embeddings, torch.stack(cast(list[torch.Tensor], attentions), dim=1)

    def run_blocks(
        self, x: torch.Tensor, need_weights: bool = True
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """What the first block reads (B, T, D) -> what the last writes (B, T, D), and each
        block's attention weights (B, H, T, T) (None without need_weights). A hook at a
        block's input may change the batch (the replacement model's backward drops rows
        there: model/replacement.py), so nothing here holds B."""
        config, T = self.config, x.size(1)
        rotary = sliding_rotary = None
        if config.positions == "rotary":
            rotary = self.rotary(T)  # (cos, sin), 2 x (T, rotary_dims)
            if config.sliding_rope_theta is not None:  # Gemma 3: the local layers' own
                sliding_rotary = self.sliding_rotary(T)
        attentions = []
        for layer, block in enumerate(self.blocks):
            positions = self._layer_rotary(layer, rotary, sliding_rotary)
            x, weights = block(x, need_weights, positions)  # (B, T, D), (B, H, T, T)
            attentions.append(weights)
        return x, attentions

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids (B, T) at positions (T) or (B, T) -> what the first block reads (B, T, D):
        the token embeddings, scaled, projected (OPT-350m), plus the learned positions'."""
        config = self.config
        x = self.tok_emb(input_ids)  # (B, T, D)
        if config.embedding_scale != 1.0:  # Gemma: sqrt(d_model); Granite's multiplier
            x = x * config.embedding_scale
        if config.d_embed is not None:
            x = self.embed_in(x)  # (B, T, d_embed) -> (B, T, D)
        x = self.hook_embed(x)
        if config.positions == "learned":
            table = self.pos_emb(positions)  # (T, D) or (B, T, D)
            if self.hook_pos_embed.active:  # TransformerLens' shape, only for whoever asks
                table = self.hook_pos_embed(table.expand_as(x))  # (B, T, D)
            x = x + table
        return x

    def _layer_rotary(
        self,
        layer: int,
        rotary: tuple[torch.Tensor, torch.Tensor] | None,
        sliding_rotary: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rotary tables layer `layer` reads: the sliding layers' own where they have them."""
        if sliding_rotary is not None and self.config.window(layer) is not None:
            return sliding_rotary
        return rotary

    def decode(
        self,
        input_ids: torch.Tensor,
        past_mask: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """One step of generation with a KV cache: the next-token logits after T new tokens
        of each text, given every layer's keys and values of the P positions before them.

        input_ids (B, T); past_mask (B, P) int64, 1 where a past key is one of the text's
        (0: padding, where a batch's texts have different lengths; anywhere, the real keys
        in order); past: each layer's (key, value), (B, H_kv, P, d_k) each (P may be 0: a
        prompt). -> logits (B, V) after each text's last token, and each layer's keys and
        values of all P + T positions. The hook points run as in forward, so a change
        made there applies to every position a step computes.
        """
        config = self.config
        T = input_ids.size(1)
        # Each text's positions count its own tokens, wherever its padding is.
        before = past_mask.cumsum(-1) - 1  # (B, P): each past key's position
        start = past_mask.sum(-1, keepdim=True)  # (B, 1): how many tokens came before
        new = start + torch.arange(T, device=input_ids.device)  # (B, T)
        keys = torch.cat((before, new), dim=1)  # (B, S) for S = P + T
        real = torch.cat((past_mask > 0, torch.ones_like(new, dtype=torch.bool)), dim=1)
        seen = real[:, None, :] & (keys[:, None, :] <= new[:, :, None])  # (B, T, S)
        x = self.embed(input_ids, new)  # (B, T, D)
        rotary = sliding_rotary = None
        if config.positions == "rotary":
            rotary = self.rotary.at(new)  # 2 x (B, 1, T, dims)
            if config.sliding_rope_theta is not None:
                sliding_rotary = self.sliding_rotary.at(new)
        presents = []
        for layer, block in enumerate(self.blocks):
            mask, window = seen, config.window(layer)
            if window is not None:  # a sliding layer sees the window's last keys only
                mask = mask & (new[:, :, None] - keys[:, None, :] < window)
            cache = KVCache(*past[layer], mask[:, None])  # (B, 1, T, S)
            x, _ = block(x, False, self._layer_rotary(layer, rotary, sliding_rotary), cache)
            presents.append((cache.key, cache.value))
        return self.unembed(self.finish(x[:, -1])), presents  # (B, V)

    def residual_stream(
        self, input_ids: torch.Tensor, need_weights: bool = True
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """The residual stream x_0 (what the first block reads) .. x_L (what the last one
        wrote, before the final norm), each (B, T, D), read at its hook points; and the
        attentions as forward's."""
        L = self.config.n_layers
        names = [RESID_PRE.format(layer=layer) for layer in range(L)]
        names.append(RESID_POST.format(layer=L - 1))
        with captured(self, names) as values:
            _, attentions = self(input_ids, need_weights)
        return [values[name] for name in names], attentions

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """The last residual x_L (B, T, D) -> the model's output: the final norm, and OPT's
        projection back to the embedding width."""
        if self.config.norm_placement != "post":  # post-norm blocks end normed already
            x = self.ln_f(x)
        if self.config.d_embed is not None:
            x = self.embed_out(x)  # (B, T, d_embed)
        return x

    def unembed(self, y: torch.Tensor) -> torch.Tensor:
        """The model's output (..., embedding_dim) -> next-token logits (..., V): the
        unembedding (the token table when tied), its bias, Granite's scale, Gemma 2's cap."""
        config = self.config
        if config.unembedding == "none":
            raise ValueError(f"{config.name} has no unembedding (its checkpoint had no LM head)")
        if config.unembedding == "tied":
            logits = F.linear(y, self.tok_emb.weight)  # (..., V)
        else:
            logits = self.lm_head(y)
        if config.logit_scale != 1.0:
            logits = logits * config.logit_scale
        if config.logit_softcap is not None:
            logits = torch.tanh(logits / config.logit_softcap) * config.logit_softcap
        return logits

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (B, T) -> next-token logits (B, T, V), as AutoModelForCausalLM's."""
        embeddings, _ = self(input_ids, need_weights=False)
        return self.unembed(embeddings)

    def hidden_states(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, L+1, T, D) as transformers' output_hidden_states: x_0 .. x_(L-1), and the
        final norm of x_L (before OPT-350m's projection out, which changes the width)."""
        stream, _ = self.residual_stream(input_ids, False)
        last = self.ln_f(stream[-1]) if self.config.norm_placement != "post" else stream[-1]
        return torch.stack([*stream[:-1], last], dim=1)

    def lens(self, residual: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The logit lens: any layer's residual (..., D) read as if it were the last, by the
        final norm with the scale of `last` (x_L at the same position) frozen, then the
        unembedding (TransformerLens' apply_ln_to_stack(..., recompute_ln=False) through
        ln_final, times W_U). With residual = last each state is normalised by its own
        statistics (TransformerLens >= 2.18's accumulated_resid(apply_ln=True)); at x_L
        either is the model's own logits."""
        if self.config.norm_placement != "post":
            residual = frozen_norm(self.ln_f, residual, norm_scale(self.ln_f, last))
        if self.config.d_embed is not None:
            residual = self.embed_out(residual)
        return self.unembed(residual)

    def attribution(
        self,
        heads: torch.Tensor,
        mlps: torch.Tensor,
        first: torch.Tensor,
        last: torch.Tensor,
        targets: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Direct logit attribution at N positions: each target's logit split into what
        each part of x_L = x_0 + sum over layers of (W_O's heads, W_O's bias, the MLP)
        writes along the target's unembedding, through the final norm with the scale of
        x_L frozen (TransformerLens' apply_ln_to_stack), plus a constant (the norm's bias
        and the unembedding's). Where a norm takes what attention writes (Gemma 2/3's
        sandwich, OLMo 2's output norms), its scale is frozen too, at the heads' sum. The
        parts add up to the logit before Gemma 2's soft-cap.

        heads (N, L, H*d_k): the heads' outputs as each W_O reads them (after the head
        mask), mlps (N, L, D), first x_0 (N, D), last x_L (N, D), targets (N, n) ids ->
        parts of heads (N, n, L, H), attention biases (N, n, L), MLPs (N, n, L), the
        embeddings (N, n), and the constant (N, n).
        """
        config = self.config
        refusal = config.attribution_refusal
        if refusal is not None:
            raise ValueError(f"{config.name} has no direct logit attribution: {refusal}")
        H, d_k, D = config.n_heads, config.head_dim, config.d_model
        unembedding = self.tok_emb if config.unembedding == "tied" else self.lm_head
        # a lookup, as the token embeddings are: the graph reads the stored table itself
        u = F.embedding(targets, unembedding.weight)  # (N, n, D): each target's direction
        constant = u.new_zeros(targets.shape)  # (N, n)
        if config.unembedding_bias:
            ids = targets.flatten()  # a 1-D lookup: the graph gathers from the stored bias
            constant = constant + self.lm_head.bias.index_select(0, ids).view_as(constant)
        # The frozen final norm is linear: u . norm(x) = w . x + u . bias, for w the
        # direction times the norm's weight over the scale (centred for LayerNorm, where
        # (x - mean x) . w = x . (w - mean w)).
        norm = self.ln_f
        gain = cast(torch.Tensor, norm.weight)
        if isinstance(norm, RMSNorm):
            gain = gain + norm.offset
        w = u * gain / norm_scale(norm, last)[:, None]  # (N, n, D)
        if isinstance(norm, nn.LayerNorm):
            constant = constant + u @ norm.bias
            w = w - w.mean(-1, keepdim=True)
        w, constant = w * config.logit_scale, constant * config.logit_scale
        # Each head alone through W_O: its slice of the concatenation, the others zero.
        alone = torch.eye(H, dtype=heads.dtype, device=heads.device)[:, :, None]  # (H, H, 1)
        head_parts, bias_parts, mlp_parts = [], [], []
        for layer, block in enumerate(self.blocks):
            block = cast(Block, block)
            projection = block.attn.proj
            z = heads[:, layer].unflatten(-1, (H, d_k))  # (N, H, d_k)
            by_head = (alone * z[:, None]).flatten(-2)  # (N, H, H*d_k)
            written = F.linear(by_head, projection.weight)  # (N, H, D)
            bias: torch.Tensor = (
                written.new_zeros(D) if projection.bias is None else projection.bias
            )
            if hasattr(block, "ln1_out"):
                # Gemma 2's and OLMo 2's norm of what attention writes, its scale frozen at
                # the heads' sum, is linear: each head's share is its part of the norm.
                # (What the MLP writes, mlps, is read after its norm: one part, exact.)
                out = block.ln1_out
                whole = F.linear(heads[:, layer], projection.weight, projection.bias)  # (N, D)
                frozen = norm_scale(out, whole)  # (N, 1)
                written = frozen_linear(out, written, frozen[:, None])  # (N, H, D)
                bias = frozen_norm(out, bias, frozen)  # (N, D): the norm's own bias with it
            head_parts.append(w @ written.transpose(1, 2))  # (N, n, H)
            bias_parts.append((w * bias.unsqueeze(-2)).sum(-1))  # (N, n)
            mlp_parts.append((w * mlps[:, layer, None]).sum(-1))  # (N, n)
        scale = config.residual_scale  # Granite scales what each sublayer adds
        return (
            torch.stack(head_parts, dim=2) * scale,  # (N, n, L, H)
            torch.stack(bias_parts, dim=2) * scale,  # (N, n, L)
            torch.stack(mlp_parts, dim=2) * scale,  # (N, n, L)
            (w * first[:, None]).sum(-1),  # (N, n)
            constant,
        )


def _init_weights(module: nn.Module) -> None:
    # GPT-2's scheme: small normal weights keep the residual stream stable at init.
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def encoder_from_weights(config: ModelConfig, weights: dict[str, torch.Tensor]) -> Encoder:
    """An Encoder in eval mode whose parameters are `weights` themselves: no random
    initialisation first, no copy (a checkpoint's weights cost their size once)."""
    with torch.device("meta"):  # shapes only: nothing is allocated or initialised
        model = Encoder(config)
    model.load_state_dict(weights, strict=True, assign=True)
    for name, rotary in rotary_modules(config).items():  # computed tables: made for real
        setattr(model, name, rotary)
    return model.eval()


def rotary_modules(config: ModelConfig) -> dict[str, Rotary]:
    """The rotary tables by attribute name: `rotary` for every layer, or for the global
    ones where the sliding layers have their own (`sliding_rotary`, never scaled)."""
    if config.positions != "rotary":
        return {}
    tables = {"rotary": Rotary(config)}
    if config.sliding_rope_theta is not None:
        tables["sliding_rotary"] = Rotary(config, config.sliding_rope_theta, scaled=False)
    return tables


def build_encoder(config: ModelConfig, seed: int = 0) -> Encoder:
    """A randomly initialised encoder, reproducible from the seed, in eval mode."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = Encoder(config)
    finally:
        torch.random.set_rng_state(generator_state)
    return model.eval()
