"""The gradient of a metric through the model as it is, nothing frozen (softmax, GELU, every
norm's own scale): what attribution patching multiplies by (source - input) at each site,
and input-times-gradient saliency by the tokens' embeddings.

The metric is patching's, logit(target) - logit(contrast) after one position. Its gradient
is taken at every site an intervention changes (model/hooks.py changeable), through the
same hooks the readouts graph changes them by: a zero added at each site, whose gradient is
the site's. torch's ONNX exporter refuses autograd over ops whose backward reads their
forward's values (research/backward-graph), so export/gradient.py traces this function's
`torch.func.vjp` into aten ops first (research/real-backward), at one length per graph.
"""

from __future__ import annotations

import torch
from torch import nn

from attnserve.model.encoder import Encoder
from attnserve.model.hook_points import Hook, captured, hooked, site_changes
from attnserve.model.hooks import EMBED, changeable, kind_heads


def site_shapes(model: Encoder, length: int) -> dict[str, tuple[int, ...]]:
    """Each changeable kind's values at every layer, (1, L, T, D) or per head
    (1, L, T, heads, head_dim): what a zero added to all of them is shaped as."""
    config = model.config
    shapes = {}
    for kind in changeable(config):
        heads = kind_heads(config, kind)
        width = (config.d_model,) if heads is None else (heads, config.head_dim)
        shapes[kind] = (1, config.n_layers, length, *width)
    return shapes


class Metric(nn.Module):
    """logit(target) - logit(contrast) after `position` of input_ids (1, T), with `deltas`
    added at every changeable site (by kind, site_shapes) and `embed_delta` (1, T, D) at
    hook_embed; also returns the embeddings there (T, D)."""

    def __init__(self, model: Encoder) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        position: torch.Tensor,
        target: torch.Tensor,
        contrast: torch.Tensor,
        deltas: dict[str, torch.Tensor],
        embed_delta: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        kinds = changeable(self.model.config)
        ones = embed_delta.new_ones(1, self.model.config.n_layers, 1, 1)
        changes = {kind: (ones, deltas[kind], ones) for kind in kinds}
        add: Hook = lambda x: x + embed_delta  # noqa: E731
        with (
            hooked(self.model, {EMBED: add, **site_changes(kinds, changes)}),
            captured(self.model, [EMBED]) as values,
        ):
            # the weights computed, not the fused kernel: its backward is one fused op
            # the exporter has no ONNX function for
            embeddings, _ = self.model(input_ids)  # (1, T, E)
        # (1, E) -> (V,): the unembedding of one row, as the model's other graphs have it
        logits = self.model.unembed(embeddings[0].index_select(0, position))[0]
        return logits[target] - logits[contrast], values[EMBED][0]


def metric_gradients(
    metric: Metric,
    params: dict[str, torch.Tensor],
    input_ids: torch.Tensor,
    position: torch.Tensor,
    target: torch.Tensor,
    contrast: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """The metric (1,), its gradient at each changeable site by kind, (L, T, width) (a
    per-head site's heads side by side), and at hook_embed (T, D), and the embeddings
    there (T, D). `params`: the metric's parameters and buffers by name (the values
    torch.func.functional_call runs it with, so that a trace takes them as inputs)."""
    T = input_ids.shape[1]
    shapes = site_shapes(metric.model, T)
    zero = params[next(iter(params))].new_zeros
    deltas = {kind: zero(shape) for kind, shape in shapes.items()}
    embed_delta = zero(1, T, metric.model.config.d_model)

    def run(
        deltas: dict[str, torch.Tensor], embed_delta: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        args = (input_ids, position, target, contrast, deltas, embed_delta)
        return torch.func.functional_call(metric, params, args)

    # with has_aux: (output, its vjp, the aux), which torch's stubs do not say
    value, pull, embeddings = torch.func.vjp(run, deltas, embed_delta, has_aux=True)  # type: ignore[misc]
    site_grads, embed_grad = pull(torch.ones_like(value))
    grads = [site_grads[kind][0].flatten(2) for kind in shapes]  # (L, T, width) each
    return value, *grads, embed_grad[0], embeddings
