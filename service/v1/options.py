"""attnserve.v1's EncodeRequest -> the data plane's inputs and options (core/request.py).

The fields keep their names (the data plane's errors name them as the messages do); what
is translated here is the message's own: which `content` of an input is set, which
sub-messages are present, and the enums' numbers, each checked (an unknown number is
refused with the field's name, as protobuf keeps numbers it does not know).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from google.protobuf.message import Message

from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.readouts import READOUTS, ReadoutKind
from attnserve.service.core.request import (
    AttentionOptions,
    EncodeOptions,
    HeadReduction,
    HeadScale,
    Input,
    Intervention,
    Layout,
    LensNorm,
    PatchingMethod,
    PatchingOptions,
    Pooling,
    PredictionsOptions,
)
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import from_tensor


class _Words:
    """A .proto enum's numbers -> the data plane's words (POOLING_MEAN: Pooling("mean");
    its UNSPECIFIED 0: None), made once: a value without a word fails at import."""

    def __init__(self, enum, words: Callable[[str], object]) -> None:
        prefix = enum.Name(0).removesuffix("UNSPECIFIED")
        self.names = list(enum.keys())
        self.by_number = {
            number: words(name.removeprefix(prefix).lower()) if number else None
            for name, number in enum.items()
        }

    def __call__(self, field: str, value: int):
        """The word of `value`, refused with the field's name if the enum has no such value."""
        if value not in self.by_number:
            raise InvalidInputError(f"{field}: {value} is not one of {self.names}")
        return self.by_number[value]


_POOLING = _Words(pb.Pooling, Pooling)
_LAYOUT = _Words(pb.AttentionLayout, Layout)
_HEAD_REDUCTION = _Words(pb.HeadReduction, HeadReduction)
_LENS_NORM = _Words(pb.LensNorm, LensNorm)
_TRUNCATE = _Words(pb.Truncation, lambda word: word == "right")  # none, right
_OP = _Words(pb.InterventionOp, str)  # add, set, scale
_PATCHING_METHOD = _Words(pb.PatchingMethod, PatchingMethod)


def inputs_of(request: pb.EncodeRequest) -> list[Input]:
    """attnserve.v1's inputs as the plan takes them: each text, or its ids as int64."""
    return [input_of(f"inputs[{index}]", item) for index, item in enumerate(request.inputs)]


def input_of(field: str, item: pb.Input) -> Input:
    kind = item.WhichOneof("content")
    if kind == "text":
        return item.text
    if kind == "token_ids":
        return np.array(list(item.token_ids.ids), dtype=np.int64)
    raise InvalidInputError(f"{field}: set either text or token_ids")


def options_of(options: pb.EncodeOptions) -> EncodeOptions:
    """The data plane's options of an EncodeRequest's."""
    readouts: dict[str, Any] = {
        kind.option: _TRANSLATED.get(kind.option, _plain)(kind, getattr(options, kind.option))
        if options.HasField(kind.option)
        else None
        for kind in READOUTS
    }
    return EncodeOptions(
        truncate=bool(_TRUNCATE("options.truncation", options.truncation)),
        pooling=_POOLING("options.pooling", options.pooling) or Pooling.NONE,
        token_embeddings=not options.skip_token_embeddings,
        return_tokens=options.return_tokens,
        attention=_attention(options.attention) if options.HasField("attention") else None,
        head_mask=tuple(
            HeadScale(entry.layer, entry.head, entry.scale, tuple(entry.mean))
            for entry in options.head_mask
        ),
        interventions=tuple(
            intervention_of(f"options.interventions[{i}]", entry)
            for i, entry in enumerate(options.interventions)
        ),
        **readouts,
    )


def _plain(kind: ReadoutKind, message: Message) -> object:
    """A readout's options whose fields are its message's, by name (a repeated one as a
    tuple): most readouts' (a new one's too)."""
    fields = message.DESCRIPTOR.fields_by_name
    values = {}
    for field in dataclasses.fields(kind.options):
        value = getattr(message, field.name)
        values[field.name] = tuple(value) if fields[field.name].is_repeated else value
    return kind.options(**values)


def _predictions(kind: ReadoutKind, request: pb.TokenPredictionsRequest) -> PredictionsOptions:
    field = f"options.{kind.option}"
    norm = _LENS_NORM(f"{field}.lens_norm", request.lens_norm)
    return PredictionsOptions(
        layers=tuple(request.layers),
        positions=tuple(request.positions),
        top_k=request.top_k,
        target_ids=tuple(request.target_ids),
        logits=request.logits,
        lens_norm=norm or LensNorm.FROZEN,
    )


def _patching(_: ReadoutKind, request: pb.PatchingRequest) -> PatchingOptions:
    return PatchingOptions(
        source=input_of("options.patching.source", request.source),
        hook=request.hook,
        target=_token(request, "target"),
        contrast=_token(request, "contrast"),
        method=_PATCHING_METHOD("options.patching.method", request.method)
        or PatchingMethod.ACTIVATION,
    )


# The readouts whose messages are not their options field by field (an enum, a oneof)
_TRANSLATED: dict[str, Callable[[ReadoutKind, Any], object]] = {
    "predictions": _predictions,
    "logit_lens": _predictions,
    "patching": _patching,
}


def _token(patching: pb.PatchingRequest, name: str) -> int | str:
    """PatchingRequest's target or contrast: its id, or its text."""
    kind = patching.WhichOneof(f"{name}_token")
    if kind is None:
        raise InvalidInputError(f"options.patching: set {name}_id or {name}")
    return getattr(patching, kind)


def intervention_of(field: str, entry: pb.Intervention) -> Intervention:
    op = _OP(f"{field}.op", entry.op)
    if op is None:
        raise InvalidInputError(f"{field}.op: name one of {_OP.names[1:]}")
    values = None
    if entry.HasField("values"):
        if entry.values.dtype not in (pb.DTYPE_UNSPECIFIED, pb.DTYPE_FLOAT32, pb.DTYPE_FLOAT16):
            raise InvalidInputError(
                f"{field}.values.dtype: {entry.values.dtype} is not DTYPE_FLOAT32 or DTYPE_FLOAT16"
            )
        tensor = pb.Tensor(shape=entry.values.shape, data=entry.values.data)
        tensor.dtype = entry.values.dtype or pb.DTYPE_FLOAT32
        if any(size < 0 for size in tensor.shape):
            raise InvalidInputError(
                f"{field}.values.shape: {list(tensor.shape)} has a negative size"
            )
        try:
            values = from_tensor(tensor).astype(np.float32)
        except ValueError as exc:
            raise InvalidInputError(f"{field}.values: {exc}") from None
    return Intervention(
        hook=entry.hook,
        op=op,
        values=values,
        scale=entry.scale if entry.HasField("scale") else None,
        positions=tuple(entry.positions),
        heads=tuple(entry.heads),
        feature=(entry.feature.sae, entry.feature.feature_id)
        if entry.HasField("feature")
        else None,
    )


def _attention(request: pb.AttentionRequest) -> AttentionOptions:
    field = "options.attention"
    if request.dtype not in (pb.DTYPE_UNSPECIFIED, pb.DTYPE_FLOAT32, pb.DTYPE_FLOAT16):
        raise InvalidInputError(
            f"{field}.dtype: {request.dtype} is not DTYPE_FLOAT32 or DTYPE_FLOAT16"
        )
    layout = _LAYOUT(f"{field}.layout", request.layout)
    return AttentionOptions(
        layers=tuple(request.layers),
        heads=tuple(request.heads),
        query_positions=tuple(request.query_positions),
        float16=request.dtype == pb.DTYPE_FLOAT16,
        layout=layout or Layout.FULL,
        head_reduction=_HEAD_REDUCTION(f"{field}.head_reduction", request.head_reduction),
        rollout=request.rollout,
        top_k=request.top_k,
        head_entropy=request.head_entropy,
        omit_weights=request.omit_weights,
        row_entropy=request.row_entropy,
        received=request.received,
        key_start=request.key_start,
        key_end=request.key_end,
    )
