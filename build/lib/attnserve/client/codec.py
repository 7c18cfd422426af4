"""Python values -> EncodeRequest, and EncodeResponse -> numpy: shared by both clients."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import from_tensor, unpack_causal

Input = str | Sequence[int] | np.ndarray  # text, or token ids

POOLINGS = {"none": pb.POOLING_NONE, "mean": pb.POOLING_MEAN, "last": pb.POOLING_LAST}
DTYPES = {"float32": pb.DTYPE_FLOAT32, "float16": pb.DTYPE_FLOAT16}
LAYOUTS = {"full": pb.ATTENTION_LAYOUT_FULL, "causal-packed": pb.ATTENTION_LAYOUT_CAUSAL_PACKED}


@dataclass
class Encoding:
    """One input's encoding, decoded to numpy (attention always full float32)."""

    token_ids: np.ndarray  # (T,) int64
    embeddings: np.ndarray | None  # (T, d_model) float32
    pooled: np.ndarray | None  # (d_model,) float32
    attention: np.ndarray | None  # (len(layers), len(heads), T, T) float32
    layers: list[int] = field(default_factory=list)  # attention's axis 0
    heads: list[int] = field(default_factory=list)  # attention's axis 1
    truncated: bool = False
    tokens: list[str] = field(default_factory=list)  # display strings, if asked for


@dataclass
class EncodeOutput:
    """The encodings of a request, in input order, with the server's timings."""

    encodings: list[Encoding]
    queue_ns: int
    inference_ns: int
    total_ns: int
    model_version: str
    request_id: str
    response: pb.EncodeResponse  # as received

    @property
    def wire_bytes(self) -> int:
        """Size of the serialised response (computed on demand: it walks the message)."""
        return self.response.ByteSize()

    def __len__(self) -> int:
        return len(self.encodings)

    def __getitem__(self, index: int) -> Encoding:
        return self.encodings[index]

    def __iter__(self) -> Iterator[Encoding]:
        return iter(self.encodings)


def _choice(name: str, value: str, choices: dict[str, int]) -> int:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return choices[value]


def build_request(
    inputs: Input | Sequence[Input],
    *,
    attention: bool = False,
    layers: Sequence[int] = (),
    heads: Sequence[int] = (),
    attention_dtype: str = "float32",
    attention_layout: str = "full",
    pooling: str = "none",
    token_embeddings: bool = True,
    truncate: bool = False,
    return_tokens: bool = False,
    request_id: str = "",
) -> pb.EncodeRequest:
    """inputs: one text, one id sequence, or a list of those."""
    if isinstance(inputs, str) or (
        isinstance(inputs, np.ndarray | Sequence) and len(inputs) and _is_id(inputs[0])
    ):
        inputs = [inputs]
    request = pb.EncodeRequest(request_id=request_id)
    for item in inputs:
        if isinstance(item, str):
            request.inputs.add(text=item)
        else:
            request.inputs.add(token_ids=pb.TokenIds(ids=[int(i) for i in item]))
    options = request.options
    options.pooling = _choice("pooling", pooling, POOLINGS)
    options.skip_token_embeddings = not token_embeddings
    options.truncation = pb.TRUNCATION_RIGHT if truncate else pb.TRUNCATION_NONE
    options.return_tokens = return_tokens
    if attention or layers or heads:
        options.attention.layers.extend(layers)
        options.attention.heads.extend(heads)
        options.attention.dtype = _choice("attention_dtype", attention_dtype, DTYPES)
        options.attention.layout = _choice("attention_layout", attention_layout, LAYOUTS)
    return request


def _is_id(value: object) -> bool:
    return isinstance(value, int | np.integer)


def decode_response(response: pb.EncodeResponse) -> EncodeOutput:
    encodings = []
    for result in response.results:
        ids = np.asarray(result.token_ids, dtype=np.int64)
        attention = None
        if result.HasField("attention"):
            weights = from_tensor(result.attention)
            if weights.ndim == 3:  # causal-packed: (L, H, T (T + 1) / 2)
                attention = unpack_causal(weights, len(ids))
            else:
                attention = weights.astype(np.float32, copy=False)
        encodings.append(
            Encoding(
                token_ids=ids,
                embeddings=from_tensor(result.embeddings)
                if result.HasField("embeddings")
                else None,
                pooled=from_tensor(result.pooled) if result.HasField("pooled") else None,
                attention=attention,
                layers=list(result.attention_layers),
                heads=list(result.attention_heads),
                truncated=result.truncated,
                tokens=list(result.tokens),
            )
        )
    t = response.timings
    return EncodeOutput(
        encodings,
        t.queue_ns,
        t.inference_ns,
        t.total_ns,
        response.model_version,
        response.request_id,
        response,
    )
