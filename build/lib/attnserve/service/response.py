"""Results -> EncodeResponse: the whole answer (tensors, tokens, timings) built in one place."""

from __future__ import annotations

from attnserve.model.tokenizer import Tokenizer
from attnserve.service.batcher import SequenceResult
from attnserve.service.plan import EncodePlan
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import NUMPY_DTYPES, fill_tensor, pack_causal


def build_response(
    plan: EncodePlan,
    results: list[SequenceResult],
    tokenizer: Tokenizer,
    model_version: str,
    request_id: str,
) -> pb.EncodeResponse:
    """One result per planned sequence, in order; timings.total_ns is left to the caller,
    who alone knows when the request arrived."""
    response = pb.EncodeResponse(model_version=model_version, request_id=request_id)
    for ids, truncated, result in zip(plan.sequences, plan.truncated, results, strict=True):
        out = response.results.add()
        _fill_result(out, ids.tolist(), truncated, result, plan)
        if plan.return_tokens:
            out.tokens[:] = tokenizer.token_strings(out.token_ids)
    response.timings.queue_ns = max(r.queue_ns for r in results)
    response.timings.inference_ns = max(r.inference_ns for r in results)
    return response


def _fill_result(
    out: pb.EncodeResult,
    ids: list[int],
    truncated: bool,
    result: SequenceResult,
    plan: EncodePlan,
) -> None:
    """Write one input's result into `out` (built in place: no copies of large bytes)."""
    out.token_ids[:] = ids
    out.truncated = truncated
    if plan.token_embeddings:
        fill_tensor(out.embeddings, result.embeddings)
    if plan.pooling == pb.POOLING_MEAN:
        fill_tensor(out.pooled, result.embeddings.mean(axis=0))
    elif plan.pooling == pb.POOLING_LAST:
        fill_tensor(out.pooled, result.embeddings[-1])
    if plan.attention and result.attentions is not None:
        a = plan.attention
        weights = result.attentions  # (L, H, T, T)
        if a.layers != list(range(weights.shape[0])):
            weights = weights.take(a.layers, axis=0)
        if a.heads != list(range(weights.shape[1])):
            weights = weights.take(a.heads, axis=1)  # (L', H', T, T)
        # Narrow the dtype first: packing and copying then move half the bytes.
        weights = weights.astype(NUMPY_DTYPES[a.dtype], copy=False)
        if a.packed:
            weights = pack_causal(weights)  # (L', H', T (T + 1) / 2)
        fill_tensor(out.attention, weights, a.dtype)
        out.attention_layers[:] = a.layers
        out.attention_heads[:] = a.heads
