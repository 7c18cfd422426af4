"""The data plane's results -> attnserve.v1's EncodeResponse: the whole answer (tensors,
tokens, timings) built in one place, its large tensors spliced into the bytes it is sent as
(attnserve/v1/wire.py SplicedMessage)."""

from __future__ import annotations

from dataclasses import replace

from google.protobuf.message import Message

from attnserve.model.tokenizer import Tokenizer
from attnserve.service.core.backend import (
    AttentionSelection,
    Features,
    FeaturesSelection,
    Predictions,
    PredictionsSelection,
    ReadoutOutput,
    ReadoutSelection,
)
from attnserve.service.core.batching import SequenceResult
from attnserve.service.core.plan import EncodePlan, pooled
from attnserve.service.core.request import Pooling
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import (
    ATTRIBUTION_PARTS,
    RESULTS_FIELD,
    SplicedMessage,
    fill_tensor,
    nested,
)


class EncodeAnswer:
    """An EncodeResponse whose results' large tensors are spliced in when it is serialized."""

    def __init__(self, message: pb.EncodeResponse, results: list[SplicedMessage]) -> None:
        self.message = message
        self.results = results  # one per message.results, in order

    def parts(self) -> list[bytes | memoryview]:
        if not any(result.spliced for result in self.results):
            return [self.message.SerializeToString()]
        head = pb.EncodeResponse()
        head.CopyFrom(self.message)  # cheap: the large bytes are not in it
        head.ClearField("results")
        parts: list[bytes | memoryview] = [head.SerializeToString()]
        for result in self.results:
            parts += nested((RESULTS_FIELD,), result.parts())
        return parts

    def serialize(self) -> bytes:
        """The EncodeResponse's bytes, each large tensor copied once, into them."""
        return b"".join(self.parts())

    def serialize_in(self, envelope: Message, field: str) -> bytes:
        """The bytes of `envelope` (an EncodeStreamResponse or EncodeLayersResponse) with this
        answer as its `field`."""
        number = envelope.DESCRIPTOR.fields_by_name[field].number
        return b"".join([envelope.SerializeToString(), *nested((number,), self.parts())])

    def filled(self) -> pb.EncodeResponse:
        """The EncodeResponse message itself, large tensors copied in (for JSON)."""
        for result in self.results:
            result.filled()
        return self.message


def build_response(
    plan: EncodePlan,
    results: list[SequenceResult],
    tokenizer: Tokenizer,
    model_version: str,
    request_id: str,
) -> EncodeAnswer:
    """One result per planned sequence, in order; timings.total_ns is left to the caller,
    who alone knows when the request arrived."""
    response = pb.EncodeResponse(model_version=model_version, request_id=request_id)
    spliced = []
    for index, result in enumerate(results):
        out = SplicedMessage(response.results.add())
        _fill_result(out, index, result, plan)
        if plan.return_tokens:
            out.message.tokens[:] = tokenizer.token_strings(out.message.token_ids)
        if plan.readouts and result.readouts:
            _fill_readouts(out, plan.readouts[index], result.readouts, tokenizer)
        spliced.append(out)
    response.timings.queue_ns = max(r.queue_ns for r in results)
    response.timings.inference_ns = max(r.inference_ns for r in results)
    return EncodeAnswer(response, spliced)


def split_attention_layers(
    plan: EncodePlan, results: list[SequenceResult]
) -> tuple[list[SequenceResult], list[SplicedMessage]]:
    """EncodeLayers' parts: the results without their attention weights, and those weights as
    one EncodeLayersResponse per input and selected layer (inputs, then layers, in order)."""
    rest, layers = [], []
    for index, result in enumerate(results):
        a = result.attention
        if a is None or a.weights is None or plan.attention is None:
            rest.append(result)
            continue
        rest.append(replace(result, attention=replace(a, weights=None)))
        dtype = _attention_dtype(plan.attention[index])
        for layer_index, weights in enumerate(a.weights):
            part = pb.AttentionLayer(result_index=index, layer_index=layer_index)
            layer = SplicedMessage(pb.EncodeLayersResponse(attention_layer=part))
            layer.put("attention_layer.attention", weights, dtype)
            layers.append(layer)
    return rest, layers


def _fill_result(out: SplicedMessage, index: int, result: SequenceResult, plan: EncodePlan) -> None:
    """Write input `index`'s result into `out` (an EncodeResult)."""
    message = out.message
    message.token_ids[:] = plan.sequences[index].tolist()
    message.truncated = plan.truncated[index]
    if plan.token_embeddings:
        out.put("embeddings", result.embeddings)
    if plan.pooling != Pooling.NONE:
        out.put("pooled", pooled(result.embeddings, plan.pooling))
    if result.attention is not None and plan.attention is not None:
        selection, a = plan.attention[index], result.attention
        if a.weights is not None:
            out.put("attention", a.weights, _attention_dtype(selection))
        if a.indices is not None:
            out.put("attention_indices", a.indices, pb.DTYPE_INT32)
        if a.entropy is not None:
            out.put("head_entropy", a.entropy)
        if a.row_entropy is not None:
            out.put("attention_row_entropy", a.row_entropy)
        if a.received is not None:
            out.put("attention_received", a.received)
        message.attention_layers[:] = selection.layers
        message.attention_heads[:] = selection.heads
        message.attention_rows[:] = a.rows.tolist()


def _attention_dtype(selection: AttentionSelection) -> pb.Dtype:
    return pb.DTYPE_FLOAT16 if selection.float16 else pb.DTYPE_FLOAT32


def _fill_readouts(
    out: SplicedMessage,
    selection: ReadoutSelection,
    readouts: ReadoutOutput,
    tokenizer: Tokenizer,
) -> None:
    message = out.message
    hidden = selection.hidden_states
    if hidden is not None:
        if readouts.hidden_states is not None:
            out.put("hidden_states", readouts.hidden_states)
        if readouts.hidden_state_norms is not None:
            out.put("hidden_state_norms", readouts.hidden_state_norms)
        message.hidden_state_layers[:] = hidden.layers
        message.hidden_state_positions[:] = hidden.positions
    for field, asked, got in (
        ("predictions", selection.predictions, readouts.predictions),
        ("logit_lens", selection.lens, readouts.lens),
    ):
        if asked is not None and got is not None:
            _fill_predictions(out, field, asked, got, tokenizer)
    asked_attribution, attribution = selection.attribution, readouts.attribution
    if asked_attribution is not None and attribution is not None:
        a = message.attribution
        a.positions[:] = asked_attribution.positions
        a.target_ids[:] = asked_attribution.targets
        a.contrast_ids[:] = asked_attribution.contrasts
        for name in ATTRIBUTION_PARTS:
            out.put(f"attribution.{name}", getattr(attribution, name))
    if selection.features is not None and readouts.features is not None:
        _fill_features(out, selection.features, readouts.features)
    if selection.capture is not None and readouts.activations is not None:
        for hook, values in readouts.activations.items():
            fill_tensor(message.activations[hook], values)  # a map entry: not spliced
        message.activation_positions[:] = selection.capture.positions
    if selection.patching is not None and readouts.patching is not None:
        grid = message.patching
        grid.hook = selection.patching.kind
        grid.clean, grid.corrupted = readouts.patching.clean, readouts.patching.corrupted
        grid.warning = readouts.patching.warning or ""
        out.put("patching.values", readouts.patching.values)
        if readouts.patching.saliency is not None:
            out.put("patching.saliency", readouts.patching.saliency)


def _fill_features(out: SplicedMessage, asked: FeaturesSelection, got: Features) -> None:
    """The SAEFeatures of `out`'s EncodeResult."""
    message = out.message.features
    message.saes[:] = asked.saes
    message.positions[:] = asked.positions
    message.feature_ids[:] = asked.feature_ids
    out.put("features.top_ids", got.top_ids, pb.DTYPE_INT32)
    out.put("features.top_activations", got.top_activations)
    out.put("features.l0", got.l0, pb.DTYPE_INT32)
    if got.error_norm is not None:
        out.put("features.error_norm", got.error_norm)
    if got.feature_activations is not None:
        out.put("features.feature_activations", got.feature_activations)
    if got.activations is not None:
        out.put("features.activations", got.activations)


def _fill_predictions(
    out: SplicedMessage,
    field: str,
    asked: PredictionsSelection,
    got: Predictions,
    tokenizer: Tokenizer,
) -> None:
    """The TokenPredictions at `field` of `out`'s EncodeResult."""
    message: pb.TokenPredictions = getattr(out.message, field)
    message.layers[:] = asked.layers
    message.positions[:] = asked.positions
    out.put(f"{field}.top_ids", got.top_ids, pb.DTYPE_INT32)
    out.put(f"{field}.top_probabilities", got.top_probabilities)
    message.top_tokens[:] = tokenizer.token_strings(got.top_ids.ravel().tolist())
    if got.target_probabilities is not None:
        out.put(f"{field}.target_probabilities", got.target_probabilities)
    if got.logits is not None:
        out.put(f"{field}.logits", got.logits)
