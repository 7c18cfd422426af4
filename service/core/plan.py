"""Inputs and EncodeOptions -> EncodePlan: every input tokenized and validated, once.

The inputs are texts or token ids as numpy arrays, whatever the transport (attnserve.v1's
EncodeRequest through `inputs_of`, the Open Inference Protocol's tensors and OpenAI's lists
directly). Every check names the request field and the limit it breaks; nothing here
touches the transport, the queue or the model. What passes here is what the batcher and
the backend may trust.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.model.tokenizer import Tokenizer
from attnserve.service.core.backend import AttentionSelection, ReadoutSelection
from attnserve.service.core.errors import InvalidInputError, ResponseTooLargeError
from attnserve.service.core.fields import enum_field, indices, positions
from attnserve.service.core.readouts import plan_readouts, readout_response_bytes
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import HEAD_REDUCTIONS, packed_length

# Room for everything in a response besides tensor bytes (ids, shapes, framing).
_OVERHEAD_BYTES_PER_TOKEN = 16
_OVERHEAD_BYTES = 4096

Input = str | np.ndarray  # a text, or its token ids (1-D, int64)


@dataclass(frozen=True)
class EncodePlan:
    sequences: list[np.ndarray]  # (T,) int64 each, validated
    truncated: list[bool]
    pooling: int  # pb.Pooling value
    token_embeddings: bool
    attention: list[AttentionSelection] | None  # one per sequence, or None: no attention
    return_tokens: bool
    # one per sequence, or None: no head mask, hidden states or predictions
    readouts: list[ReadoutSelection] | None = None

    @property
    def selections(self) -> list[AttentionSelection] | list[ReadoutSelection] | None:
        """What the batcher runs of each sequence besides embeddings (readouts hold the
        attention selection too: they run on a graph of their own)."""
        return self.readouts or self.attention


def inputs_of(request: pb.EncodeRequest) -> list[Input]:
    """attnserve.v1's inputs as the plan takes them: each text, or its ids as int64."""
    inputs: list[Input] = []
    for index, item in enumerate(request.inputs):
        kind = item.WhichOneof("content")
        if kind == "text":
            inputs.append(item.text)
        elif kind == "token_ids":
            inputs.append(np.array(list(item.token_ids.ids), dtype=np.int64))
        else:
            raise InvalidInputError(f"inputs[{index}]: set either text or token_ids")
    return inputs


def plan_request(
    inputs: Sequence[Input],
    options: pb.EncodeOptions,
    config: ModelConfig,
    tokenizer: Tokenizer,
    readable: frozenset[str] = frozenset(),
) -> EncodePlan:
    """Validate and tokenize; InvalidInputError names the field and the limit. `readable`:
    the readouts the backend computes (Backend.readouts)."""
    if not len(inputs):
        raise InvalidInputError("inputs: at least one input is required")
    truncation = enum_field(
        "options.truncation", options.truncation, pb.Truncation, default=pb.TRUNCATION_NONE
    )
    pooling = enum_field("options.pooling", options.pooling, pb.Pooling, default=pb.POOLING_NONE)
    sequences, truncated = [], []
    for index, item in enumerate(inputs):
        field = f"inputs[{index}]"
        if isinstance(item, str):
            ids: list[int] | np.ndarray = tokenizer.encode(item)
        else:
            ids = item
            field += ".token_ids"
        if not len(ids):
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
    attention = (
        _plan_attention(options.attention, config, sequences)
        if options.HasField("attention")
        else None
    )
    return EncodePlan(
        sequences,
        truncated,
        pooling,
        not options.skip_token_embeddings,
        attention,
        options.return_tokens,
        plan_readouts(options, config, sequences, attention, readable),
    )


_REDUCTIONS: dict[int, str] = {number: name for name, number in HEAD_REDUCTIONS.items()}


def _plan_attention(
    request: pb.AttentionRequest, config: ModelConfig, sequences: list[np.ndarray]
) -> list[AttentionSelection]:
    """One selection per sequence (query_positions resolve against each one's length)."""
    field = "options.attention"
    layers = indices(f"{field}.layers", request.layers, config.n_layers)
    heads = indices(f"{field}.heads", request.heads, config.n_heads)
    if request.dtype not in (pb.DTYPE_UNSPECIFIED, pb.DTYPE_FLOAT32, pb.DTYPE_FLOAT16):
        raise InvalidInputError(
            f"{field}.dtype: {request.dtype} is not DTYPE_FLOAT32 or DTYPE_FLOAT16"
        )
    layout = enum_field(
        f"{field}.layout", request.layout, pb.AttentionLayout, pb.ATTENTION_LAYOUT_FULL
    )
    packed = layout == pb.ATTENTION_LAYOUT_CAUSAL_PACKED
    reduction = enum_field(f"{field}.head_reduction", request.head_reduction, pb.HeadReduction, 0)
    if request.rollout and reduction == pb.HEAD_REDUCTION_NONE:
        raise InvalidInputError(
            f"{field}.rollout needs the heads combined: set {field}.head_reduction to "
            "HEAD_REDUCTION_MEAN or HEAD_REDUCTION_MAX (or leave it unspecified: mean)"
        )
    if request.top_k and not 1 <= request.top_k <= config.max_seq_len:
        raise InvalidInputError(
            f"{field}.top_k: {request.top_k} is outside [1, max_seq_len={config.max_seq_len}]"
        )
    if packed and request.top_k:
        raise InvalidInputError(
            f"{field}.layout: ATTENTION_LAYOUT_CAUSAL_PACKED cannot hold {field}.top_k "
            "results (k per row, not a triangle); use ATTENTION_LAYOUT_FULL"
        )
    if packed and request.query_positions:
        raise InvalidInputError(
            f"{field}.layout: ATTENTION_LAYOUT_CAUSAL_PACKED needs every row; leave "
            f"{field}.query_positions empty or use ATTENTION_LAYOUT_FULL"
        )
    if request.omit_weights and not (request.head_entropy or request.top_k):
        raise InvalidInputError(
            f"{field}.omit_weights leaves nothing to return: set {field}.head_entropy "
            f"or {field}.top_k too"
        )
    if reduction == pb.HEAD_REDUCTION_UNSPECIFIED:
        reduction = pb.HEAD_REDUCTION_MEAN if request.rollout else pb.HEAD_REDUCTION_NONE
    selection = partial(
        AttentionSelection,
        layers=tuple(sorted(layers) if request.rollout else layers),
        heads=tuple(heads),
        reduction=_REDUCTIONS[reduction],
        rollout=request.rollout,
        top_k=request.top_k,
        entropy=request.head_entropy,
        weights=not request.omit_weights,
        float16=request.dtype == pb.DTYPE_FLOAT16,
        packed=packed,
    )
    return [
        selection(rows=_query_rows(request.query_positions, len(ids), index))
        for index, ids in enumerate(sequences)
    ]


def _query_rows(values, length: int, index: int) -> tuple[int, ...] | None:
    """Absolute query positions of inputs[index] (None: every row)."""
    if not values:
        return None
    return positions("options.attention.query_positions", values, length, index)


def response_bytes(plan: EncodePlan, config: ModelConfig) -> int:
    """About what the serialised answer to `plan` will weigh."""
    total = _OVERHEAD_BYTES
    for index, ids in enumerate(plan.sequences):
        t = len(ids)
        total += t * _OVERHEAD_BYTES_PER_TOKEN
        if plan.token_embeddings:
            total += t * config.embedding_dim * 4
        if plan.pooling != pb.POOLING_NONE:
            total += config.embedding_dim * 4
        if plan.attention:
            total += attention_bytes(plan.attention[index], t)
        if plan.readouts:
            total += readout_response_bytes(plan.readouts[index], config)
    return total


def check_response_size(
    plan: EncodePlan, config: ModelConfig, limit: int, by_layer: bool = False
) -> None:
    """Refuse, before any work, an answer that would not fit in one gRPC message; `by_layer`:
    an EncodeLayers answer, whose largest message is one layer of weights or the rest."""
    total = response_bytes(plan, config)
    if by_layer and plan.attention:
        weights = [
            attention_weight_bytes(s, len(ids))
            for s, ids in zip(plan.attention, plan.sequences, strict=True)
        ]
        layers = [1 if s.rollout else len(s.layers) for s in plan.attention]
        total = max(total - sum(weights), *(w // n for w, n in zip(weights, layers, strict=True)))
    if total > limit:
        advice = "send fewer inputs per request or set options.skip_token_embeddings"
        if plan.attention:
            advice = (
                "request fewer options.attention.layers/heads/query_positions, a "
                "head_reduction, top_k, DTYPE_FLOAT16, ATTENTION_LAYOUT_CAUSAL_PACKED, or "
                "fewer inputs per request"
            )
        if plan.readouts:
            advice += (
                "; fewer layers or positions of options.hidden_states, options.predictions "
                "and options.logit_lens, a smaller top_k, or no logits"
            )
        subject = "the largest message of the response" if by_layer else "the response"
        raise ResponseTooLargeError(
            f"{subject} would be about {total:,} bytes, more than the "
            f"{limit:,}-byte message limit; {advice}"
        )


def attention_bytes(selection: AttentionSelection, length: int) -> int:
    """Bytes of the tensors `selection` makes of a sequence of `length` tokens."""
    s = selection
    total = attention_weight_bytes(s, length)
    if s.top_k:
        total += _attention_values(s, length) * 4  # int32 indices
    if s.entropy:
        total += len(s.layers) * len(s.heads) * 4
    return total


def attention_weight_bytes(selection: AttentionSelection, length: int) -> int:
    """Bytes of the weights alone (what EncodeLayers sends a layer per message)."""
    if not selection.weights:
        return 0
    return _attention_values(selection, length) * (2 if selection.float16 else 4)


def _attention_values(s: AttentionSelection, length: int) -> int:
    """Values in the weights (and in the top-k indices) of a sequence of `length` tokens."""
    layers, heads = (1, 1) if s.rollout else (len(s.layers), len(s.heads))
    if s.reduction != "none":
        heads = 1
    rows = length if s.rows is None else len(s.rows)
    per_head = packed_length(length) if s.packed else rows * (s.top_k or length)
    return layers * heads * per_head
