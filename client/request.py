"""Python values -> EncodeRequest: what both clients send (their answers: client/codec.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypedDict, TypeVar, Unpack, cast

import numpy as np

from attnserve.v1 import encoder_service_pb2 as pb
from attnserve.v1.wire import (
    HEAD_REDUCTIONS,
    INTERVENTION_OPS,
    LAYOUTS,
    LENS_NORMS,
    PATCHING_METHODS,
    POOLINGS,
    fill_tensor,
)

Input = str | Sequence[int] | np.ndarray  # text, or token ids
Choice = TypeVar("Choice")  # an enum value of the .proto

DTYPES = {"float32": pb.DTYPE_FLOAT32, "float16": pb.DTYPE_FLOAT16}


def _choice(name: str, value: str, choices: Mapping[str, Choice]) -> Choice:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return choices[value]


class AttentionArgs(TypedDict, total=False):
    """build_request's attention options (AttentionRequest in the .proto): `attention`
    alone asks for every layer's and head's weights; `layers`, `heads` (empty: all), `rows`
    (query positions, negative from the end), `attention_dtype` ("float32", "float16"),
    `attention_layout` ("full", "causal-packed"), a `head_reduction` ("mean", "max"),
    `rollout`, `top_k`, `head_entropy`, `row_entropy`, `received` (each key's attention over
    the rows), `keys` (a tile: keys (start, end) of each row; end 0: T), and `omit_weights`
    to get only the summaries."""

    attention: bool
    layers: Sequence[int]
    heads: Sequence[int]
    attention_dtype: str
    attention_layout: str
    rows: Sequence[int]
    head_reduction: str
    rollout: bool
    top_k: int
    head_entropy: bool
    omit_weights: bool
    row_entropy: bool
    received: bool
    keys: tuple[int, int] | None


def _attention_request(a: pb.AttentionRequest, asked: AttentionArgs) -> None:
    """Fill `a` from build_request's attention options."""
    a.layers.extend(asked.get("layers", ()))
    a.heads.extend(asked.get("heads", ()))
    a.dtype = _choice("attention_dtype", asked.get("attention_dtype", "float32"), DTYPES)
    # "causal-packed" as the CLI spells it, or "causal_packed" as the Open Inference
    # Protocol's parameter does
    layout = asked.get("attention_layout", "full").replace("-", "_")
    a.layout = _choice("attention_layout", layout, LAYOUTS)
    a.query_positions.extend(asked.get("rows", ()))
    reduction = asked.get("head_reduction", "none")
    if reduction != "none":  # left unspecified: rollout then averages the heads
        a.head_reduction = _choice("head_reduction", reduction, HEAD_REDUCTIONS)
    a.rollout = asked.get("rollout", False)
    a.top_k = asked.get("top_k", 0)
    a.head_entropy = asked.get("head_entropy", False)
    a.omit_weights = asked.get("omit_weights", False)
    a.row_entropy = asked.get("row_entropy", False)
    a.received = asked.get("received", False)
    a.key_start, a.key_end = asked.get("keys") or (0, 0)


def _inputs(inputs: Input | Sequence[Input]) -> list[pb.Input]:
    """One text, one id sequence, or a list of those, as the request's inputs."""
    single = isinstance(inputs, str) or (len(inputs) > 0 and _is_id(inputs[0]))
    items = [inputs] if single else list(cast(Sequence[Input], inputs))
    return [
        pb.Input(text=item)
        if isinstance(item, str)
        else pb.Input(token_ids=pb.TokenIds(ids=[int(i) for i in cast(Sequence[int], item)]))
        for item in items
    ]


def build_request(
    inputs: Input | Sequence[Input],
    *,
    pooling: str = "none",
    token_embeddings: bool = True,
    truncate: bool = False,
    return_tokens: bool = False,
    hidden_states: bool | Mapping = False,
    predictions: bool | Mapping = False,
    logit_lens: bool | Mapping = False,
    attribution: Mapping | None = None,
    features: Mapping | None = None,
    head_mask: np.ndarray | Mapping[tuple[int, int], float] | None = None,
    head_means: Mapping[tuple[int, int], Sequence[float] | np.ndarray] | None = None,
    interventions: Sequence[Mapping] = (),
    capture: Sequence[str] | Mapping | None = None,
    patching: Mapping | None = None,
    request_id: str = "",
    model: str = "",
    **attention: Unpack[AttentionArgs],
) -> pb.EncodeRequest:
    """inputs: one text, one id sequence, or a list of those.

    Attention is returned when `attention` or any attention option is set (AttentionArgs).
    `hidden_states`, `predictions`, `logit_lens`: True, or the fields of the .proto's
    HiddenStatesRequest / TokenPredictionsRequest as a dict (e.g. `logit_lens={"positions":
    [-1], "top_k": 3, "lens_norm": "own"}`). `attribution`: the fields of
    LogitAttributionRequest as a dict (`{"target_ids": [id], "positions": [-1]}`).
    `features`: the fields of FeaturesRequest as a dict (`{"saes": ["res-16k"], "top_k": 5}`).
    `head_mask`: (n_layers, n_heads) scales, or {(layer, head): scale}; 0 removes a head.
    `head_means`: {(layer, head): head_dim floats} added to those heads' outputs after their
    scale (with scale 0: mean-ablation).
    `interventions`: changes of hook sites, each a dict of Intervention's fields with `op`
    a word ("add", "set", "scale") and `values` an array (`{"hook": "blocks.3.hook_resid_pre",
    "op": "add", "values": vector, "scale": 4.0, "positions": [-1]}`; or instead of values
    an SAE feature's direction, `"feature": {"sae": "res-16k", "feature_id": 1234}`).
    `capture`: hook names whose values to return (Encoding.activations), or the fields of
    CaptureRequest as a dict (`{"hooks": [...], "positions": [-1]}`).
    `patching`: activation patching (Encoding.patching): `{"source": clean text or ids,
    "hook": "resid_pre", "target": " Mary", "contrast": " John"}` (target and contrast:
    one token's text, or its id; `"method": "attribution"`: its linear estimate, with
    the input's saliency).
    `model` names a served model (empty: the server's default).
    """
    request = pb.EncodeRequest(request_id=request_id, model=model, inputs=_inputs(inputs))
    options = request.options
    options.pooling = _choice("pooling", pooling, POOLINGS)
    options.skip_token_embeddings = not token_embeddings
    options.truncation = pb.TRUNCATION_RIGHT if truncate else pb.TRUNCATION_NONE
    options.return_tokens = return_tokens
    # a dtype, a layout or no head reduction alone ask for nothing
    choices = ("attention_dtype", "attention_layout", "head_reduction")
    asked = [value for name, value in attention.items() if name not in choices]
    if any(asked) or attention.get("head_reduction", "none") != "none":
        _attention_request(options.attention, attention)
    for name, value in (
        ("hidden_states", hidden_states),
        ("predictions", predictions),
        ("logit_lens", logit_lens),
    ):
        if value is not False:
            getattr(options, name).SetInParent()  # True: every default
            if isinstance(value, Mapping):
                value = dict(value)
                if isinstance(value.get("lens_norm"), str):  # "frozen" or "own"
                    value["lens_norm"] = _choice("lens_norm", value["lens_norm"], LENS_NORMS)
                getattr(options, name).MergeFrom(type(getattr(options, name))(**value))
    if attribution is not None:
        options.attribution.MergeFrom(pb.LogitAttributionRequest(**attribution))
    if features is not None:
        options.features.MergeFrom(pb.FeaturesRequest(**features))
    if head_mask is not None or head_means:
        options.head_mask.extend(_head_scales(head_mask, head_means or {}))
    options.interventions.extend(intervention_message(entry) for entry in interventions)
    if capture is not None:
        fields = dict(capture) if isinstance(capture, Mapping) else {"hooks": list(capture)}
        options.capture.MergeFrom(pb.CaptureRequest(**fields))
    if patching is not None:
        options.patching.MergeFrom(_patching(patching))
    return request


def _patching(fields: Mapping) -> pb.PatchingRequest:
    """build_request's patching as the message: the source an input, each token by its text
    (a str) or its id."""
    message = pb.PatchingRequest(hook=fields["hook"])
    source = fields["source"]
    if isinstance(source, str):
        message.source.text = source
    else:
        message.source.token_ids.ids.extend(int(i) for i in source)
    for name in ("target", "contrast"):
        token = fields[name]
        if isinstance(token, str):
            setattr(message, name, token)
        else:
            setattr(message, f"{name}_id", int(token))
    if "method" in fields:
        message.method = _choice("method", fields["method"], PATCHING_METHODS)
    return message


def intervention_message(entry: Mapping) -> pb.Intervention:
    """One of build_request's interventions as the message: its op a word, values an array."""
    fields = dict(entry)
    fields["op"] = _choice("op", fields["op"], INTERVENTION_OPS)
    values = fields.pop("values", None)
    message = pb.Intervention(**fields)
    if values is not None:
        fill_tensor(message.values, np.asarray(values, dtype=np.float32))
    return message


def array_head_mask(options: Mapping[str, object]) -> np.ndarray | None:
    """The head mask of build_request's `options` where it is an array (which a client checks
    against the model's shape before sending), else None."""
    mask = options.get("head_mask")
    if mask is None or isinstance(mask, Mapping):
        return None
    return np.asarray(mask, dtype=np.float32)


def check_head_mask(mask: np.ndarray, info: Mapping[str, object]) -> None:
    """ValueError unless `mask` is (n_layers, n_heads) of the model `info` describes: only the
    entries that are not 1 are sent, so a transposed mask would remove other heads silently."""
    want = (info["n_layers"], info["n_heads"])
    if mask.shape != want:
        raise ValueError(
            f"head_mask has shape {mask.shape}; model {info['name']!r} has "
            f"(n_layers, n_heads) = {want}"
        )


def _head_scales(
    head_mask: np.ndarray | Mapping[tuple[int, int], float] | None,
    head_means: Mapping[tuple[int, int], Sequence[float] | np.ndarray],
) -> list[pb.HeadScale]:
    """The heads a mask changes (every entry of a mapping, the entries of an array that are
    not 1) or moves by a mean (their scale 1 unless the mask says otherwise)."""
    items: Iterable[tuple[tuple[int, int], float]] = ()
    if isinstance(head_mask, Mapping):
        items = head_mask.items()
    elif head_mask is not None:
        mask = np.asarray(head_mask, dtype=np.float32)
        if mask.ndim != 2:
            raise ValueError(f"head_mask must be (n_layers, n_heads), got shape {mask.shape}")
        changed = np.argwhere(mask != 1)
        items = (((int(layer), int(head)), mask[layer, head]) for layer, head in changed)
    scales = {head: float(scale) for head, scale in items}
    return [
        pb.HeadScale(
            layer=layer,
            head=head,
            scale=scales.get((layer, head), 1.0),
            mean=[float(v) for v in head_means.get((layer, head), ())],
        )
        for layer, head in {**scales, **dict.fromkeys(head_means)}
    ]


def _is_id(value: object) -> bool:
    return isinstance(value, int | np.integer)
