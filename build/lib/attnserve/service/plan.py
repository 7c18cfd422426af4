"""EncodeRequest -> EncodePlan: every input decoded, tokenized and validated, once.

Every check names the request field and the limit it breaks; nothing here
touches the transport, the queue or the model. What passes here is what the
batcher and the backend may trust.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.model.tokenizer import Tokenizer
from attnserve.service.errors import InvalidInputError, ResponseTooLargeError
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import NUMPY_DTYPES, packed_length

# Room for everything in a response besides tensor bytes (ids, shapes, framing).
_OVERHEAD_BYTES_PER_TOKEN = 16
_OVERHEAD_BYTES = 4096


@dataclass(frozen=True)
class AttentionPlan:
    layers: list[int]
    heads: list[int]
    dtype: int  # pb.DTYPE_FLOAT32 or pb.DTYPE_FLOAT16
    packed: bool


@dataclass(frozen=True)
class EncodePlan:
    sequences: list[np.ndarray]  # (T,) int64 each, validated
    truncated: list[bool]
    pooling: int  # pb.Pooling value
    token_embeddings: bool
    attention: AttentionPlan | None
    return_tokens: bool


def plan_request(
    request: pb.EncodeRequest, config: ModelConfig, tokenizer: Tokenizer
) -> EncodePlan:
    """Validate and tokenize; InvalidInputError names the field and the limit."""
    if not request.inputs:
        raise InvalidInputError("inputs: at least one input is required")
    options = request.options
    truncation = _enum_field(
        "options.truncation", options.truncation, pb.Truncation, default=pb.TRUNCATION_NONE
    )
    pooling = _enum_field("options.pooling", options.pooling, pb.Pooling, default=pb.POOLING_NONE)
    sequences, truncated = [], []
    for index, item in enumerate(request.inputs):
        field = f"inputs[{index}]"
        kind = item.WhichOneof("content")
        if kind == "text":
            ids = tokenizer.encode(item.text)
        elif kind == "token_ids":
            ids = list(item.token_ids.ids)
            field += ".token_ids"
        else:
            raise InvalidInputError(f"{field}: set either text or token_ids")
        if not ids:
            raise InvalidInputError(f"{field}: the sequence is empty")
        cut = len(ids) > config.max_seq_len
        if cut and truncation != pb.TRUNCATION_RIGHT:
            raise InvalidInputError(
                f"{field} has {len(ids)} tokens, more than max_seq_len={config.max_seq_len}; "
                "send fewer or set options.truncation=TRUNCATION_RIGHT"
            )
        array = np.asarray(ids[: config.max_seq_len], dtype=np.int64)
        bad = array[(array < 0) | (array >= config.vocab_size)]
        if bad.size:
            raise InvalidInputError(
                f"{field}: token id {int(bad[0])} is outside the vocabulary "
                f"[0, {config.vocab_size})"
            )
        sequences.append(array)
        truncated.append(cut)
    attention = _plan_attention(options, config) if options.HasField("attention") else None
    return EncodePlan(
        sequences,
        truncated,
        pooling,
        not options.skip_token_embeddings,
        attention,
        options.return_tokens,
    )


def _enum_field(name: str, value: int, enum, default: int) -> int:
    if value not in enum.values():
        raise InvalidInputError(f"{name}: {value} is not one of {list(enum.keys())}")
    return value or default


def _plan_attention(options: pb.EncodeOptions, config: ModelConfig) -> AttentionPlan:
    request = options.attention
    layers = _indices("options.attention.layers", request.layers, config.n_layers)
    heads = _indices("options.attention.heads", request.heads, config.n_heads)
    dtype = request.dtype or pb.DTYPE_FLOAT32
    if dtype not in NUMPY_DTYPES:
        raise InvalidInputError(
            f"options.attention.dtype: {request.dtype} is not DTYPE_FLOAT32 or DTYPE_FLOAT16"
        )
    layout = _enum_field(
        "options.attention.layout", request.layout, pb.AttentionLayout, pb.ATTENTION_LAYOUT_FULL
    )
    return AttentionPlan(layers, heads, dtype, layout == pb.ATTENTION_LAYOUT_CAUSAL_PACKED)


def _indices(name: str, values, limit: int) -> list[int]:
    chosen = list(values) or list(range(limit))
    for v in chosen:
        if not 0 <= v < limit:
            raise InvalidInputError(f"{name}: {v} is outside [0, {limit})")
    if len(set(chosen)) != len(chosen):
        raise InvalidInputError(f"{name}: {chosen} repeats an index")
    return chosen


def check_response_size(plan: EncodePlan, config: ModelConfig, limit: int) -> None:
    """Refuse, before any work, an answer that would not fit in one gRPC message."""
    total = _OVERHEAD_BYTES
    for ids in plan.sequences:
        t = len(ids)
        total += t * _OVERHEAD_BYTES_PER_TOKEN
        if plan.token_embeddings:
            total += t * config.d_model * 4
        if plan.pooling != pb.POOLING_NONE:
            total += config.d_model * 4
        if plan.attention:
            a = plan.attention
            per_head = packed_length(t) if a.packed else t * t
            itemsize = NUMPY_DTYPES[a.dtype].itemsize
            total += len(a.layers) * len(a.heads) * per_head * itemsize
    if total > limit:
        advice = (
            "request fewer options.attention.layers/heads, DTYPE_FLOAT16, "
            "ATTENTION_LAYOUT_CAUSAL_PACKED, or fewer inputs per request"
            if plan.attention
            else "send fewer inputs per request or set options.skip_token_embeddings"
        )
        raise ResponseTooLargeError(
            f"the response would be about {total:,} bytes, more than the "
            f"{limit:,}-byte message limit; {advice}"
        )
