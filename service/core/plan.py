"""Inputs and EncodeOptions -> EncodePlan: every input tokenized and validated, once.

The inputs are texts or token ids as numpy arrays, the options core/request.py's, whatever
the transport. Every check names the request field and the limit it breaks; nothing here
touches the transport, the queue or the model. What passes here is what the batcher and
the backend may trust.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from attnserve.model.artifacts import QUERIES_ONNX_FILENAME
from attnserve.model.config import ModelConfig
from attnserve.model.packing import packed_length
from attnserve.model.tokenizer import Tokenizer
from attnserve.service.core.backend import AttentionSelection, ReadoutSelection
from attnserve.service.core.errors import (
    InvalidInputError,
    ResponseTooLargeError,
    UnsupportedError,
)
from attnserve.service.core.fields import indices, positions
from attnserve.service.core.readouts import QUERIES, plan_readouts, readout_response_bytes
from attnserve.service.core.request import (
    AttentionOptions,
    EncodeOptions,
    HeadReduction,
    Input,
    Layout,
    Pooling,
)
from attnserve.service.core.view import ModelView

# Where a sequence's full weights (every selected layer's and head's T x T, held twice)
# would pass this, its attention is computed by query blocks instead (when it can be).
LONG_ATTENTION_BYTES = 256 * 2**20
# Room for everything in a response besides tensor bytes (ids, shapes, framing).
_OVERHEAD_BYTES_PER_TOKEN = 16
_OVERHEAD_BYTES = 4096


@dataclass(frozen=True)
class EncodePlan:
    sequences: list[np.ndarray]  # (T,) int64 each, validated
    truncated: list[bool]
    pooling: Pooling
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


def plan_request(
    inputs: Sequence[Input],
    options: EncodeOptions,
    view: ModelView,
) -> EncodePlan:
    """Validate and tokenize against the served model's view; InvalidInputError names the
    field and the limit."""
    config, tokenizer = view.config, view.tokenizer
    if not len(inputs):
        raise InvalidInputError("inputs: at least one input is required")
    sequences, truncated = [], []
    for index, item in enumerate(inputs):
        array, cut = tokenized(f"inputs[{index}]", item, options, config, tokenizer)
        sequences.append(array)
        truncated.append(cut)
    source = None
    if options.patching is not None:
        patching = options.patching
        field = "options.patching.source"
        source = tokenized(field, patching.source, options, config, tokenizer)[0]
        target, contrast = (
            _token_id(f"options.patching.{name}", token, tokenizer)
            for name, token in (("target", patching.target), ("contrast", patching.contrast))
        )
        options = replace(options, patching=replace(patching, target=target, contrast=contrast))
    attention = None
    if options.attention is not None:
        attention = _plan_attention(options.attention, config, sequences, view.graphs)
    readouts = plan_readouts(options, view, sequences, attention, source)
    if readouts and attention and any(s.blocked for s in attention):
        if options.attention is not None and _statistics(options.attention):
            raise InvalidInputError(
                "options.attention: received, row_entropy and key_start/key_end are computed "
                "from the model as it is; ask for them in a request without hidden states, "
                "predictions, the logit lens, attribution, features, captures or changes"
            )
        # the readouts graph computes the attention it returns, under the changes
        attention = [replace(s, blocked=False) for s in attention]
        readouts = [replace(r, attention=s) for r, s in zip(readouts, attention, strict=True)]
    return EncodePlan(
        sequences,
        truncated,
        options.pooling,
        options.token_embeddings,
        attention,
        options.return_tokens,
        readouts,
    )


def _token_id(field: str, token: int | str, tokenizer: Tokenizer) -> int:
    """A token given by its id, or by its text: which must be one token."""
    if not isinstance(token, str):
        return token
    ids = tokenizer.token_ids(token)
    if len(ids) != 1:
        raise InvalidInputError(
            f"{field}: {token!r} is {len(ids)} tokens of the model's vocabulary ({ids}), "
            "not one; give one token's text or its id"
        )
    return ids[0]


def tokenized(
    field: str, item: Input, options: EncodeOptions, config: ModelConfig, tokenizer: Tokenizer
) -> tuple[np.ndarray, bool]:
    """One input's ids, checked, and whether they were cut to max_seq_len."""
    if isinstance(item, str):
        ids: list[int] | np.ndarray = tokenizer.encode(item)
    else:
        ids = item
        field += ".token_ids"
    if not len(ids):
        raise InvalidInputError(f"{field}: the sequence is empty")
    cut = len(ids) > config.max_seq_len
    if cut and not options.truncate:
        raise InvalidInputError(
            f"{field} has {len(ids)} tokens, more than max_seq_len={config.max_seq_len}; "
            "send fewer or set options.truncation=TRUNCATION_RIGHT"
        )
    array = np.asarray(ids[: config.max_seq_len], dtype=np.int64)
    bad = array[(array < 0) | (array >= config.vocab_size)]
    if bad.size:
        raise InvalidInputError(
            f"{field}: token id {int(bad[0])} is outside the vocabulary [0, {config.vocab_size})"
        )
    return array, cut


def _statistics(request: AttentionOptions) -> bool:
    """Whether `request` asks for what only the query blocks compute."""
    return request.received or request.row_entropy or bool(request.key_start or request.key_end)


def _refuse_attention(
    request: AttentionOptions, config: ModelConfig, readable: frozenset[str]
) -> None:
    """The attention options that cannot go together, or that the model cannot compute."""
    field = "options.attention"
    packed = request.layout == Layout.CAUSAL_PACKED
    if request.rollout and request.head_reduction == HeadReduction.NONE:
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
    summaries = request.head_entropy or request.top_k or request.row_entropy or request.received
    if request.omit_weights and not summaries:
        raise InvalidInputError(
            f"{field}.omit_weights leaves nothing to return: set {field}.head_entropy, "
            f"{field}.row_entropy, {field}.received or {field}.top_k too"
        )
    statistics = _statistics(request)
    if statistics and (request.rollout or packed):
        raise InvalidInputError(
            f"{field}: received, row_entropy and key_start/key_end are per row of each head; "
            f"leave {field}.rollout unset and use ATTENTION_LAYOUT_FULL"
        )
    if (request.key_start or request.key_end) and request.top_k:
        raise InvalidInputError(
            f"{field}.key_start/key_end: a tile holds every weight of its keys; leave "
            f"{field}.top_k at 0"
        )
    if statistics and QUERIES not in readable:
        raise UnsupportedError(
            f"{field}: {config.name} has no queries graph ({QUERIES_ONNX_FILENAME}), from "
            "which received, row_entropy and tiles are computed: re-export it with "
            "`attnserve export`"
        )


def _plan_attention(
    request: AttentionOptions,
    config: ModelConfig,
    sequences: list[np.ndarray],
    readable: frozenset[str],
) -> list[AttentionSelection]:
    """One selection per sequence (query_positions resolve against each one's length): by
    query blocks (blocked) where it asks for statistics or its weights would not fit in
    LONG_ATTENTION_BYTES, the model's queries graph permitting."""
    field = "options.attention"
    layers = indices(f"{field}.layers", request.layers, config.n_layers)
    heads = indices(f"{field}.heads", request.heads, config.n_heads)
    packed = request.layout == Layout.CAUSAL_PACKED
    _refuse_attention(request, config, readable)
    statistics = _statistics(request)
    reduction = request.head_reduction
    per_square = 2 * config.n_layers * config.n_heads * 4  # the full path holds it twice
    blockable = QUERIES in readable and not (request.rollout or packed)
    if reduction is None:
        reduction = HeadReduction.MEAN if request.rollout else HeadReduction.NONE
    selection = partial(
        AttentionSelection,
        layers=tuple(sorted(layers) if request.rollout else layers),
        heads=tuple(heads),
        reduction=reduction.value,
        rollout=request.rollout,
        top_k=request.top_k,
        entropy=request.head_entropy,
        row_entropy=request.row_entropy,
        received=request.received,
        weights=not request.omit_weights,
        float16=request.float16,
        packed=packed,
    )
    return [
        selection(
            rows=_query_rows(request.query_positions, len(ids), index),
            key_range=_key_range(request, len(ids), index),
            blocked=blockable and (statistics or per_square * len(ids) ** 2 > LONG_ATTENTION_BYTES),
        )
        for index, ids in enumerate(sequences)
    ]


def _key_range(request: AttentionOptions, length: int, index: int) -> tuple[int, int] | None:
    """inputs[index]'s tile of keys [start, end), or None: every key."""
    if not (request.key_start or request.key_end):
        return None
    start, end = request.key_start, request.key_end or length
    if not 0 <= start < end <= length:
        raise InvalidInputError(
            f"options.attention.key_start/key_end: [{request.key_start}, {request.key_end}) "
            f"is not a tile of inputs[{index}]'s keys: 0 <= key_start < key_end <= {length} "
            "(key_end 0: through the last token)"
        )
    return start, end


def _query_rows(values: tuple[int, ...], length: int, index: int) -> tuple[int, ...] | None:
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
        if plan.pooling != Pooling.NONE:
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
            if any(s.features is not None for s in plan.readouts):
                advice += (
                    "; fewer options.features.saes, positions or feature_ids, a smaller "
                    "top_k, or no dense activations"
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
    rows = length if s.rows is None else len(s.rows)
    if s.row_entropy:
        total += len(s.layers) * len(s.heads) * rows * 4
    if s.received:
        total += len(s.layers) * (1 if s.reduction != "none" else len(s.heads)) * length * 4
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
    keys = length if s.key_range is None else s.key_range[1] - s.key_range[0]
    per_head = packed_length(length) if s.packed else rows * (s.top_k or keys)
    return layers * heads * per_head


def pooled(embeddings: np.ndarray, pooling: Pooling) -> np.ndarray:
    """One vector of a sequence's (T, d_model) embeddings: their mean, or the last token's
    (in a causal model only the last token has seen the whole input)."""
    return embeddings.mean(axis=0) if pooling == Pooling.MEAN else embeddings[-1]
