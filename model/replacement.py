"""The local replacement model of circuit tracing, frozen at one prompt, and its backward.

Attribution graphs (Ameisen et al. 2025; circuit-tracer) replace each MLP by a transcoder
and freeze, at the prompt, what makes the model non-linear: every attention pattern,
every norm's scale, and each MLP's output (its transcoder's reconstruction plus the error:
constants; only a transcoder's skip connection, x_in @ W_skip^T, stays a function of the
stream). What remains is linear from the embeddings to the logits, so one backward pass
per target node gives the direct effect of every source on it.

That model is the encoder's own code under hooks (model/hook_points.py), not a second
model: the prompt's patterns and scales given at their sites, each MLP's output replaced
by its skip. Run on zeros, its backward is the transposed linear map alone, which torch's
exporter traces to ONNX (export/backward.py) from `torch.autograd.grad` inside a forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from attnserve.model import hooks
from attnserve.model.encoder import Encoder
from attnserve.model.hook_points import Hook, captured, hook_points, hooked


@dataclass(frozen=True)
class Transcoders:
    """What the replacement model needs of a transcoder set: the site each layer's
    transcoder reads ("{layer}" unfilled, e.g. blocks.{layer}.hook_resid_mid or
    blocks.{layer}.ln2.hook_normalized) and each layer's skip, W_skip (D, d_in), or None.
    Each writes its layer's hook_mlp_out."""

    input_site: str
    skips: Sequence[torch.Tensor | None]


class Frozen(NamedTuple):
    """The prompt's values the replacement model is frozen at (batch 1) and what the
    attribution reads off the same run."""

    patterns: list[torch.Tensor]  # each layer's (1, H, T, T)
    scales: dict[str, torch.Tensor]  # each norm's hook_scale by site name, (1, T, 1)
    inputs: torch.Tensor  # (L, T, d_in): what each layer's transcoder reads
    outputs: torch.Tensor  # (L, T, D): what each MLP writes (hook_mlp_out)
    logits: torch.Tensor  # (V,): the next-token logits after the last position
    embeddings: torch.Tensor  # (T, D): the tokens' embeddings at hook_embed (token nodes)


def scale_sites(model: Encoder) -> list[str]:
    """Every norm's hook_scale on the stream's path (the queries' and keys' norms have none:
    they lie behind the frozen patterns)."""
    return [name for name in hook_points(model) if name.endswith(hooks.SCALE)]


def freeze(model: Encoder, input_ids: torch.Tensor, input_site: str) -> Frozen:
    """Run `model` on input_ids (1, T) and keep what its replacement is frozen at."""
    L = model.config.n_layers
    patterns = [hooks.PATTERN.format(layer=layer) for layer in range(L)]
    inputs = [input_site.format(layer=layer) for layer in range(L)]
    outputs = [hooks.MLP_OUT.format(layer=layer) for layer in range(L)]
    scales = scale_sites(model)
    sites = [hooks.EMBED, *patterns, *scales, *inputs, *outputs]
    with torch.no_grad(), captured(model, sites) as values:
        embeddings, _ = model(input_ids)
        # (1, D) -> (1, V): the unembedding as a 2-D product, as the model's own graphs
        # have it (Gemm reads a tied table as stored: no transposed copy of it)
        logits = model.unembed(embeddings[:, -1])[0]
    return Frozen(
        [values[name] for name in patterns],
        {name: values[name] for name in scales},
        torch.cat([values[name] for name in inputs]),  # (L, T, d_in)
        torch.cat([values[name] for name in outputs]),
        logits,
        values[hooks.EMBED][0],
    )


def backward(
    model: Encoder,
    frozen: Frozen,
    transcoders: Transcoders,
    grads: torch.Tensor,
    layers: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`layered`'s backward for N rows in any order: row n puts grads[n] (D) at position
    positions[n] of layer layers[n]'s transcoder input site; (N, L, T, D), (N, T, D)."""
    L = model.config.n_layers
    chosen = [torch.nonzero(layers == layer)[:, 0] for layer in range(L + 1)]
    mlp, embed = layered(
        model, frozen, transcoders, [grads[c] for c in chosen], [positions[c] for c in chosen]
    )
    order = torch.cat(chosen)  # the rows' places in layer order
    return mlp[torch.argsort(order)], embed[torch.argsort(order)]


def layered(
    model: Encoder,
    frozen: Frozen,
    transcoders: Transcoders,
    grads: Sequence[torch.Tensor],
    positions: Sequence[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The replacement model's backward for rows given layer by layer: grads[l] (N_l, D)
    put at positions[l] (N_l,) of layer l's transcoder input site (l = L: the model's output
    after the final norm, where a logit's direction is put), and read where they arrive:
    (N, L, T, D) at each layer's hook_mlp_out (what its transcoder's features and error
    write) and (N, T, D) at hook_embed (the tokens' embeddings, as they enter), the rows in
    layer order. A row at layer l needs nothing above its place, so each block runs on the
    rows of its layer and above only: block j's batch leaves out the rows of layers below
    j, and their gradients there are zeros without being computed."""
    config = model.config
    if config.d_embed is not None:
        raise ValueError(
            f"{config.name}: its output is projected to {config.d_embed} (OPT-350m): "
            "no replacement model"
        )
    T, L, D = frozen.outputs.shape[1], config.n_layers, config.d_model
    counts = [g.shape[0] for g in grads]
    from_layer = [sum(counts[j:]) for j in range(L + 1)]  # the batch at block j
    new, x_at = grads[0].new_zeros, grads[0].device
    # where each row reads: the value at these sites is zero (the model runs at x = 0, so
    # nothing but the transposed map is left to compute), its gradient is the answer
    embed_read = new(from_layer[0], T, D).requires_grad_()
    mlp_reads = [new(from_layer[j], T, D).requires_grad_() for j in range(L)]
    reached: dict[int, torch.Tensor] = {}  # each layer's transcoder input, as the run reaches it
    frozen_at = _frozen_hooks(frozen, transcoders, counts, embed_read, mlp_reads, reached)
    with torch.enable_grad(), hooked(model, frozen_at):
        x = model.embed(new(from_layer[0], T, dtype=torch.long), torch.arange(T, device=x_at))
        output = model.finish(model.run_blocks(x)[0])  # (rows of layers L - 1 and L, T, D)
        # each layer's rows are the first of the batch that reaches its site
        sites = [reached[layer][: counts[layer]] for layer in range(L)]
        sites.append(output[counts[L - 1] :])
        objective = sum(
            # <site at the row's position, the row's gradient>; the position picked by a
            # comparison, not one_hot: its width would be traced as a constant
            ((site * g[:, None, :]).sum(-1) * (p[:, None] == torch.arange(T, device=x_at))).sum()
            for site, g, p in zip(sites, grads, positions, strict=True)
        )
        read = torch.autograd.grad(
            cast(torch.Tensor, objective), [*mlp_reads, embed_read], allow_unused=True
        )
    # a layer's gradients for the rows below it (not in its batch) and where none arrives
    filled = [
        new(from_layer[0], T, D)
        if g is None
        else torch.cat([new(from_layer[0] - from_layer[j], T, D), g])
        for j, g in enumerate(read[:L])
    ]
    embed = read[L] if read[L] is not None else new(from_layer[0], T, D)
    return torch.stack(filled, dim=1), embed


def _frozen_hooks(
    frozen: Frozen,
    transcoders: Transcoders,
    counts: list[int],
    embed_read: torch.Tensor,
    mlp_reads: list[torch.Tensor],
    reached: dict[int, torch.Tensor],
) -> dict[str, Hook]:
    """What makes the encoder `layered`'s replacement model: the embeddings and each MLP's
    output read from `embed_read` and `mlp_reads` (plus a skip of the layer's transcoder
    input), the patterns and scales frozen, each transcoder's input kept in `reached`, and
    at each block's input the rows of the layer below (counts[layer - 1], the batch's
    first) leaving the batch."""
    L = len(mlp_reads)

    def given(value: torch.Tensor) -> Hook:  # a frozen value, for the batch where it is read
        return lambda current: value.expand(current.shape[0], *value.shape[1:])

    def keep(layer: int) -> Hook:
        return lambda x: reached.__setitem__(layer, x)

    def mlp_out(layer: int) -> Hook:
        skip = transcoders.skips[layer]

        def hook(_: torch.Tensor) -> torch.Tensor:
            read = mlp_reads[layer]
            return read if skip is None else read + reached[layer] @ skip.T

        return hook

    def leave(layer: int) -> Hook:
        return lambda x: x[counts[layer - 1] :]

    frozen_at: dict[str, Hook] = {hooks.EMBED: lambda _: embed_read}
    frozen_at |= {hooks.RESID_PRE.format(layer=j): leave(j) for j in range(1, L)}
    frozen_at |= {hooks.PATTERN.format(layer=i): given(p) for i, p in enumerate(frozen.patterns)}
    frozen_at |= {name: given(scale) for name, scale in frozen.scales.items()}
    for i in range(L):  # a parallel block's transcoder reads its input: after the rows leave
        site = transcoders.input_site.format(layer=i)
        frozen_at[site] = _then(frozen_at[site], keep(i)) if site in frozen_at else keep(i)
    frozen_at |= {hooks.MLP_OUT.format(layer=i): mlp_out(i) for i in range(L)}
    return frozen_at


def _then(first: Hook, second: Hook) -> Hook:
    """Both hooks at one site, the second reading what the first made of it."""

    def hook(x: torch.Tensor) -> torch.Tensor | None:
        made = first(x)
        x = x if made is None else made
        again = second(x)
        return x if again is None else again

    return hook


class Primitives(TorchFunctionMode):
    """While tracing a backward, write F.linear as a matmul and a matmul of more than three
    axes as bmm: torch 2.13's exporter fails on their backward under autograd otherwise
    ("a fake tensor in the exported program's constants"; research/backward-graph)."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            y = torch.matmul(x, weight.transpose(0, 1))
            return y if bias is None else y + bias
        if func in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__):
            a, b = args
            if a.dim() > 3 and b.dim() > 3 and a.shape[:-2] == b.shape[:-2]:
                batch = a.shape[:-2]
                out = torch.bmm(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]))
                return out.reshape(*batch, *out.shape[-2:])
        return func(*args, **kwargs)


class BackwardGraph(nn.Module):
    """What export/backward.py traces: the prompt in (input_ids (1, T)) with the rows layer
    by layer (grads, L + 1 of (N_l, D); positions, L + 1 of (N_l,) int64), and out the
    rows' gradients, in layer order, at every hook_mlp_out (N, L, T, D) and at hook_embed
    (N, T, D), with the prompt's transcoder inputs (L, T, d_in), MLP outputs (L, T, D),
    last logits (V,), token embeddings (T, D) and skips' outputs (L, T, D): one graph, so
    that the frozen values never leave ONNX Runtime between the prompt and its rows."""

    def __init__(self, model: Encoder, transcoders: Transcoders) -> None:
        super().__init__()
        self.model, self.input_site = model, transcoders.input_site
        self.skipped = [skip is not None for skip in transcoders.skips]
        for layer, skip in enumerate(transcoders.skips):
            if skip is not None:  # named in the graph as skip_{layer}
                self.register_buffer(f"skip_{layer}", skip)

    @property
    def transcoders(self) -> Transcoders:
        skips = [self.get_buffer(f"skip_{i}") if s else None for i, s in enumerate(self.skipped)]
        return Transcoders(self.input_site, skips)

    def forward(
        self,
        input_ids: torch.Tensor,
        grads: list[torch.Tensor],
        positions: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        frozen = freeze(self.model, input_ids, self.input_site)
        with Primitives():
            mlp_grads, embed_grads = layered(self.model, frozen, self.transcoders, grads, positions)
        # (L, T, D): what each skip writes at the prompt (the error node is the MLP's output
        # less the features', b_dec and this)
        none = frozen.outputs[0].new_zeros(frozen.outputs.shape[1:])
        skips = torch.stack(
            [
                none if skip is None else x @ skip.T
                for x, skip in zip(frozen.inputs, self.transcoders.skips, strict=True)
            ]
        )
        return (
            mlp_grads,
            embed_grads,
            frozen.inputs,
            frozen.outputs,
            frozen.logits,
            frozen.embeddings,
            skips,
        )
