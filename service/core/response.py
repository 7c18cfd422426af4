"""Results -> EncodeResponse: the whole answer (tensors, tokens, timings) built in one place."""

from __future__ import annotations

import numpy as np

from attnserve.model.tokenizer import Tokenizer
from attnserve.service.core.backend import (
    Predictions,
    PredictionsSelection,
    ReadoutOutput,
    ReadoutSelection,
)
from attnserve.service.core.batcher import SequenceResult
from attnserve.service.core.plan import EncodePlan
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import ATTRIBUTION_PARTS, fill_tensor


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
    for index, result in enumerate(results):
        out = response.results.add()
        _fill_result(out, index, result, plan)
        if plan.return_tokens:
            out.tokens[:] = tokenizer.token_strings(out.token_ids)
        if plan.readouts and result.readouts:
            _fill_readouts(out, plan.readouts[index], result.readouts, tokenizer)
    response.timings.queue_ns = max(r.queue_ns for r in results)
    response.timings.inference_ns = max(r.inference_ns for r in results)
    return response


def pooled(embeddings: np.ndarray, pooling: int) -> np.ndarray:
    """One vector of a sequence's (T, d_model) embeddings: their mean, or the last token's
    (in a causal model only the last token has seen the whole input)."""
    return embeddings.mean(axis=0) if pooling == pb.POOLING_MEAN else embeddings[-1]


def _fill_result(
    out: pb.EncodeResult, index: int, result: SequenceResult, plan: EncodePlan
) -> None:
    """Write input `index`'s result into `out` (built in place: no copies of large bytes)."""
    out.token_ids[:] = plan.sequences[index].tolist()
    out.truncated = plan.truncated[index]
    if plan.token_embeddings:
        fill_tensor(out.embeddings, result.embeddings)
    if plan.pooling != pb.POOLING_NONE:
        fill_tensor(out.pooled, pooled(result.embeddings, plan.pooling))
    if result.attention is not None and plan.attention is not None:
        selection, a = plan.attention[index], result.attention
        if a.weights is not None:
            dtype = pb.DTYPE_FLOAT16 if selection.float16 else pb.DTYPE_FLOAT32
            fill_tensor(out.attention, a.weights, dtype)
        if a.indices is not None:
            fill_tensor(out.attention_indices, a.indices, pb.DTYPE_INT32)
        if a.entropy is not None:
            fill_tensor(out.head_entropy, a.entropy)
        out.attention_layers[:] = selection.layers
        out.attention_heads[:] = selection.heads
        out.attention_rows[:] = a.rows.tolist()


def _fill_readouts(
    out: pb.EncodeResult,
    selection: ReadoutSelection,
    readouts: ReadoutOutput,
    tokenizer: Tokenizer,
) -> None:
    hidden = selection.hidden_states
    if hidden is not None:
        if readouts.hidden_states is not None:
            fill_tensor(out.hidden_states, readouts.hidden_states)
        if readouts.hidden_state_norms is not None:
            fill_tensor(out.hidden_state_norms, readouts.hidden_state_norms)
        out.hidden_state_layers[:] = hidden.layers
        out.hidden_state_positions[:] = hidden.positions
    for field, asked, got in (
        ("predictions", selection.predictions, readouts.predictions),
        ("logit_lens", selection.lens, readouts.lens),
    ):
        if asked is not None and got is not None:
            _fill_predictions(getattr(out, field), asked, got, tokenizer)
    asked_attribution, attribution = selection.attribution, readouts.attribution
    if asked_attribution is not None and attribution is not None:
        a = out.attribution
        a.positions[:] = asked_attribution.positions
        a.target_ids[:] = asked_attribution.targets
        a.contrast_ids[:] = asked_attribution.contrasts
        for name in ATTRIBUTION_PARTS:
            fill_tensor(getattr(a, name), getattr(attribution, name))


def _fill_predictions(
    out: pb.TokenPredictions,
    asked: PredictionsSelection,
    got: Predictions,
    tokenizer: Tokenizer,
) -> None:
    out.layers[:] = asked.layers
    out.positions[:] = asked.positions
    fill_tensor(out.top_ids, got.top_ids, pb.DTYPE_INT32)
    fill_tensor(out.top_probabilities, got.top_probabilities)
    out.top_tokens[:] = tokenizer.token_strings(got.top_ids.ravel().tolist())
    if got.target_probabilities is not None:
        fill_tensor(out.target_probabilities, got.target_probabilities)
    if got.logits is not None:
        fill_tensor(out.logits, got.logits)
