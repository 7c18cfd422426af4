"""EncodeResponse -> numpy, the answer's values as Python types: shared by both clients
(what they send: client/request.py)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from attnserve.model.packing import unpack_causal
from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import (
    ATTRIBUTION_PARTS,
    RESULTS_FIELD,
    from_tensor,
    split_tensor_data,
)


@dataclass
class ActivationPatching:
    """An activation patching grid: logit(target) - logit(contrast) at the last position of
    the input's run with each place taken from the source's."""

    hook: str  # the kind of site patched
    values: np.ndarray  # float32 (layers, positions), hook z: (layers, heads)
    clean: float  # the difference in the source's own run
    corrupted: float  # ... and in the input's
    warning: str | None = None  # why `recovered` means little, when clean ~ corrupted
    # method "attribution": each input token's embedding times the difference's gradient
    saliency: np.ndarray | None = None  # float32 (positions,)

    def recovered(self) -> np.ndarray:
        """How much of the clean difference each place brings back: 0 as corrupted, 1 as
        clean (the explorer's colour)."""
        return (self.values - self.corrupted) / (self.clean - self.corrupted)


@dataclass
class Encoding:
    """One input's encoding, decoded to numpy (causal-packed attention unpacked, unless
    the call kept it packed).

    Attention keeps the dtype it was asked for: float16 stays float16, half the
    memory, and widening it is the caller's choice (numpy's float16 -> float32
    conversion costs more than unpacking: 9 vs 5 ms for 4 x 8 heads at 512 tokens).
    """

    token_ids: np.ndarray  # (T,) int64
    embeddings: np.ndarray | None  # (T, d_model) float32
    pooled: np.ndarray | None  # (d_model,) float32
    # (layers, heads, rows, T), or (..., rows, k) with top_k; heads is 1 after a head
    # reduction, layers and heads are 1 for rollout. Causal-packed and kept packed
    # (unpack_attention=False): (layers, heads, T (T + 1) / 2), as received.
    attention: np.ndarray | None
    layers: list[int] = field(default_factory=list)  # the layers selected (axis 0)
    heads: list[int] = field(default_factory=list)  # the heads selected (or reduced)
    truncated: bool = False
    tokens: list[str] = field(default_factory=list)  # display strings, if asked for
    rows: list[int] = field(default_factory=list)  # attention's rows: absolute positions
    indices: np.ndarray | None = None  # int32, attention's shape: top_k key positions
    head_entropy: np.ndarray | None = None  # float32 (layers, heads), nats
    # float32 (layers, heads, rows): each row's entropy, nats
    attention_row_entropy: np.ndarray | None = None
    # float32 (layers, heads, T): each key's attention summed over the rows
    attention_received: np.ndarray | None = None
    hidden_states: np.ndarray | None = None  # float32 (layers, positions, d_model)
    hidden_state_norms: np.ndarray | None = None  # float32 (layers, positions)
    hidden_state_layers: list[int] = field(default_factory=list)
    hidden_state_positions: list[int] = field(default_factory=list)
    predictions: TokenPredictions | None = None  # layers is [n_layers]
    logit_lens: TokenPredictions | None = None
    attribution: LogitAttribution | None = None
    features: SAEFeatures | None = None
    # captured sites' values by hook name, float32 (positions, width) (hook_z: (positions,
    # n_heads, head_dim)), at activation_positions
    activations: dict[str, np.ndarray] = field(default_factory=dict)
    activation_positions: list[int] = field(default_factory=list)
    patching: ActivationPatching | None = None
    # EncodeLayers' answer (encode_layers): attention one array per selected layer, as
    # received (causal-packed stays packed), and `attention` is None.
    attention_by_layer: list[np.ndarray] = field(default_factory=list)

    def unpacked_attention(self) -> np.ndarray | None:
        """attention as (layers, heads, rows, ...): unpacked now if it was kept packed."""
        if self.attention is not None and self.attention.ndim == 3:
            return unpack_causal(self.attention, len(self.token_ids))
        return self.attention


@dataclass
class LogitAttribution:
    """Direct logit attribution, each array float32 (positions, targets, ...): the parts
    add up to each target's logit before any soft-cap (less its contrast's)."""

    positions: list[int]
    target_ids: list[int]
    contrast_ids: list[int]  # one per target, or empty
    heads: np.ndarray  # (.., n_layers, n_heads)
    attention_biases: np.ndarray  # (.., n_layers)
    mlps: np.ndarray  # (.., n_layers)
    embeddings: np.ndarray  # (..)
    constants: np.ndarray  # (..)

    @property
    def total(self) -> np.ndarray:
        """The parts summed: each target's logit (or logit difference), (positions, targets)."""
        layers = self.heads.sum(-1) + self.attention_biases + self.mlps
        return layers.sum(-1) + self.embeddings + self.constants


@dataclass
class SAEFeatures:
    """Sparse-autoencoder features, each array (saes, positions, ...)."""

    saes: list[str]
    positions: list[int]
    top_ids: np.ndarray  # int32 (.., k), strongest first; -1 past the active ones
    top_activations: np.ndarray  # float32 (.., k)
    l0: np.ndarray  # int32 (..): how many features are active
    error_norm: np.ndarray | None  # float32 (..): |x - the reconstruction|; unset if skipped
    feature_ids: list[int]
    feature_activations: np.ndarray | None  # float32 (.., len(feature_ids))
    activations: np.ndarray | None  # float32 (.., d_sae), when asked for (dense)


@dataclass
class TokenPredictions:
    """Next-token distributions, each array (layers, positions, ...)."""

    layers: list[int]
    positions: list[int]
    top_ids: np.ndarray  # int32 (.., k), most probable first
    top_probabilities: np.ndarray  # float32 (.., k)
    top_tokens: np.ndarray  # str (.., k): top_ids as display strings
    target_probabilities: np.ndarray | None  # float32 (.., len(target_ids))
    logits: np.ndarray | None  # float32 (.., vocab_size)


@dataclass
class EncodeOutput:
    """The encodings of a request, in input order, with the server's timings."""

    encodings: list[Encoding]
    queue_ns: int
    inference_ns: int
    total_ns: int
    model_version: str
    request_id: str
    # As received, but for the large tensors' bytes (read in place into `encodings`); left
    # out of repr: protobuf's text format of a large map takes minutes.
    response: pb.EncodeResponse = field(repr=False)
    wire_bytes: int  # the size of the serialized response

    def __len__(self) -> int:
        return len(self.encodings)

    def __getitem__(self, index: int) -> Encoding:
        return self.encodings[index]

    def __iter__(self) -> Iterator[Encoding]:
        return iter(self.encodings)


def parse_response(raw: bytes, unpack_attention: bool = True) -> EncodeOutput:
    """The bytes of an EncodeResponse -> numpy, the large tensors read in place (no copy):
    the message is parsed without their bytes."""
    rest, found = split_tensor_data(raw, pb.EncodeResponse)
    response = pb.EncodeResponse.FromString(rest)
    return decode_response(response, found, len(raw), unpack_attention)


# The path to an EncodeLayersResponse's tensor: attention_layer.attention
_LAYER = pb.EncodeLayersResponse.DESCRIPTOR.fields_by_name["attention_layer"].number
_LAYER_ATTENTION = pb.AttentionLayer.DESCRIPTOR.fields_by_name["attention"].number


def parse_layers(parts: Iterable[bytes]) -> EncodeOutput:
    """The serialized EncodeLayersResponses of one answer -> numpy: the response, then each
    layer of attention weights read in place into its encoding's attention_by_layer."""
    parts = iter(parts)
    first = next(parts)
    rest, found = split_tensor_data(first, pb.EncodeLayersResponse)
    head = pb.EncodeLayersResponse.FromString(rest)
    if head.WhichOneof("part") != "response":
        raise ValueError("an EncodeLayers answer must begin with its response")
    inside = {path[1:]: data for path, data in found.items()}  # below the response field
    wire_bytes = len(first)
    output = decode_response(head.response, inside)
    for raw in parts:
        wire_bytes += len(raw)
        rest, found = split_tensor_data(raw, pb.EncodeLayersResponse)
        layer = pb.EncodeLayersResponse.FromString(rest).attention_layer
        arrays = output.encodings[layer.result_index].attention_by_layer
        if layer.layer_index != len(arrays):
            raise ValueError(
                f"layer {layer.layer_index} of result {layer.result_index} out of order"
            )
        arrays.append(from_tensor(layer.attention, found.get((_LAYER, _LAYER_ATTENTION))))
    output.wire_bytes = wire_bytes
    return output


class _Tensors:
    """The arrays of one message's Tensor fields: large ones read in place from the bytes
    received (split_tensor_data), small ones from the parsed message."""

    def __init__(self, message, found: dict[tuple[int, ...], memoryview], path: tuple) -> None:
        self.message, self.found, self.path = message, found, path

    def child(self, name: str) -> _Tensors:
        number = self.message.DESCRIPTOR.fields_by_name[name].number
        return _Tensors(getattr(self.message, name), self.found, (*self.path, number))

    def array(self, name: str) -> np.ndarray:
        number = self.message.DESCRIPTOR.fields_by_name[name].number
        return from_tensor(getattr(self.message, name), self.found.get((*self.path, number)))

    def optional(self, name: str) -> np.ndarray | None:
        return self.array(name) if self.message.HasField(name) else None


def decode_response(
    response: pb.EncodeResponse,
    found: dict[tuple[int, ...], memoryview] | None = None,
    wire_bytes: int | None = None,
    unpack_attention: bool = True,
) -> EncodeOutput:
    """`response` -> numpy. `found`: the bytes of the large tensors that `response` was parsed
    without (split_tensor_data); `wire_bytes`: the size of the bytes received;
    `unpack_attention`: False keeps causal-packed attention as it came (half the memory, no
    copy; Encoding.unpacked_attention unpacks it later)."""
    found = found or {}
    encodings = []
    for index, result in enumerate(response.results):
        tensors = _Tensors(result, found, (RESULTS_FIELD, index))
        ids = np.array(list(result.token_ids), dtype=np.int64)  # 2x faster than from the field
        attention = tensors.optional("attention")
        encodings.append(
            Encoding(
                token_ids=ids,
                embeddings=tensors.optional("embeddings"),
                pooled=tensors.optional("pooled"),
                attention=attention,
                layers=list(result.attention_layers),
                heads=list(result.attention_heads),
                truncated=result.truncated,
                tokens=list(result.tokens),
                rows=list(result.attention_rows),
                indices=tensors.optional("attention_indices"),
                head_entropy=tensors.optional("head_entropy"),
                attention_row_entropy=tensors.optional("attention_row_entropy"),
                attention_received=tensors.optional("attention_received"),
                hidden_states=tensors.optional("hidden_states"),
                hidden_state_norms=tensors.optional("hidden_state_norms"),
                hidden_state_layers=list(result.hidden_state_layers),
                hidden_state_positions=list(result.hidden_state_positions),
                predictions=_predictions(tensors, "predictions"),
                logit_lens=_predictions(tensors, "logit_lens"),
                attribution=_attribution(tensors),
                features=_features(tensors),
                activations={
                    hook: from_tensor(tensor) for hook, tensor in result.activations.items()
                },
                activation_positions=list(result.activation_positions),
                patching=ActivationPatching(
                    result.patching.hook,
                    tensors.child("patching").array("values"),
                    result.patching.clean,
                    result.patching.corrupted,
                    result.patching.warning or None,
                    tensors.child("patching").array("saliency")
                    if result.patching.HasField("saliency")
                    else None,
                )
                if result.HasField("patching")
                else None,
            )
        )
        if unpack_attention:
            encodings[-1].attention = encodings[-1].unpacked_attention()
    t = response.timings
    return EncodeOutput(
        encodings,
        t.queue_ns,
        t.inference_ns,
        t.total_ns,
        response.model_version,
        response.request_id,
        response,
        response.ByteSize() if wire_bytes is None else wire_bytes,
    )


def _attribution(result: _Tensors) -> LogitAttribution | None:
    if not result.message.HasField("attribution"):
        return None
    a = result.child("attribution")
    return LogitAttribution(
        list(a.message.positions),
        list(a.message.target_ids),
        list(a.message.contrast_ids),
        **{name: a.array(name) for name in ATTRIBUTION_PARTS},
    )


def _features(result: _Tensors) -> SAEFeatures | None:
    if not result.message.HasField("features"):
        return None
    f = result.child("features")
    return SAEFeatures(
        saes=list(f.message.saes),
        positions=list(f.message.positions),
        top_ids=f.array("top_ids"),
        top_activations=f.array("top_activations"),
        l0=f.array("l0"),
        error_norm=f.optional("error_norm"),
        feature_ids=list(f.message.feature_ids),
        feature_activations=f.optional("feature_activations"),
        activations=f.optional("activations"),
    )


def _predictions(result: _Tensors, name: str) -> TokenPredictions | None:
    if not result.message.HasField(name):
        return None
    tensors = result.child(name)
    message = tensors.message
    top_ids = tensors.array("top_ids")
    return TokenPredictions(
        layers=list(message.layers),
        positions=list(message.positions),
        top_ids=top_ids,
        top_probabilities=tensors.array("top_probabilities"),
        top_tokens=np.array(list(message.top_tokens), dtype=object).reshape(top_ids.shape),
        target_probabilities=tensors.optional("target_probabilities"),
        logits=tensors.optional("logits"),
    )
