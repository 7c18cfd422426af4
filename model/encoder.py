"""The encoder: token embeddings, positions (a learned table or rotary), N blocks, a final
norm."""

from __future__ import annotations

import torch
from torch import nn

from attnserve.model.config import ModelConfig
from attnserve.model.layers import Block, Rotary, make_norm


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
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.n_layers))
        if config.norm_placement != "post":  # post-norm blocks end normed already
            self.ln_f = make_norm(config)
        self.apply(_init_weights)

    def forward(
        self, input_ids: torch.Tensor, need_weights: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids (B, T) int64 -> embeddings (B, T, D), attentions (B, L, H, T, T).

        H counts query heads, also under grouped-query attention. With
        need_weights=False the attentions are None and every layer uses the fused
        attention kernel instead (same embeddings, less memory traffic).
        """
        T = input_ids.size(1)
        if self.config.max_seq_len < T:
            raise ValueError(f"sequence length {T} exceeds max_seq_len {self.config.max_seq_len}")
        config = self.config
        x = self.tok_emb(input_ids)  # (B, T, D)
        if config.embedding_scale != 1.0:  # Gemma: sqrt(d_model); Granite's multiplier
            x = x * config.embedding_scale
        if config.d_embed is not None:
            x = self.embed_in(x)  # (B, T, d_embed) -> (B, T, D)
        rotary = sliding_rotary = None
        if config.positions == "learned":
            x = x + self.pos_emb(torch.arange(T, device=input_ids.device))  # (B, T, D)
        else:
            rotary = self.rotary(T)  # (cos, sin), 2 x (T, rotary_dims)
            if config.sliding_rope_theta is not None:  # Gemma 3: the local layers' own
                sliding_rotary = self.sliding_rotary(T)
        attentions = []
        for layer, block in enumerate(self.blocks):
            positions = rotary
            if sliding_rotary is not None and config.window(layer) is not None:
                positions = sliding_rotary
            x, weights = block(x, need_weights, positions)  # (B, T, D), (B, H, T, T) or None
            attentions.append(weights)
        if config.norm_placement != "post":
            x = self.ln_f(x)
        if config.d_embed is not None:
            x = self.embed_out(x)  # (B, T, d_embed)
        if not need_weights:
            return x, None
        return x, torch.stack(attentions, dim=1)  # (B, T, D), (B, L, H, T, T)


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
