"""The encoder as Open Inference Protocol (KServe V2) tensors: ModelInfer <-> Encode.

A ModelInfer request becomes the data plane's inputs (its rows of ids as numpy arrays, or
its texts) and EncodeOptions (core/request.py), so it runs through the same plan, memory
budget and batcher as Encode (its requests, attnserve.v1's and HTTP's batch together and get
the same numbers); the data plane's arrays become named tensors. Transport-free: OipModel
(service/oip/model.py) and tests call these functions.

Inputs (one of input_ids or text):
  input_ids      INT64 [batch, seq]   right-padded rows; input_lengths gives each row's
  input_lengths  INT64 [batch]        length (without it every row is seq tokens long)
  text           BYTES [batch]        UTF-8, tokenized by the model's tokenizer
  head_mask      FP32 [layers, heads] each head's output times its entry (0 removes it),
                                      in everything the request returns
  head_means     FP32 [layers, heads, head_dim]  added to each head's output after
                                      that (mean-ablation: scale 0 and the mean)
  steering       FP32 [width]         added (times steering_scale) at steering_hook, at
                                      steering_positions: one intervention
Outputs (by name; none asked for means all of the first seven, attention_indices only
with top_k; the attention statistics and the readouts, from hidden_states on, only when
named):
  embeddings        FP32 [batch, seq, d_model]   rows past their length are zeros
  pooled            FP32 [batch, d_model]        parameter pooling: last (default) | mean
  token_ids         INT64 [batch, seq]           what the model saw (0 past a length)
  lengths           INT64 [batch]
  attention         FP32|FP16 [batch, layers, heads, rows, keys]  (or [..., packed])
  attention_indices INT32 [batch, layers, heads, rows, k]         (top_k)
  head_entropy      FP32 [batch, layers, heads]
  attention_received     FP32 [batch, layers, heads, keys]  (only when named; by query
  attention_row_entropy  FP32 [batch, layers, heads, rows]   blocks, at any length)
  hidden_states             FP32 [batch, states, positions, d_model]  (states: L + 1)
  hidden_state_norms        FP32 [batch, states, positions]
  logits                    FP32 [batch, positions, vocab]
  next_token_ids            INT32 [batch, positions, k]       most probable first
  next_token_probabilities  FP32 [batch, positions, k]
  target_probabilities      FP32 [batch, positions, targets]  (parameter target_ids)
  lens_token_ids            INT32 [batch, states, positions, k]
  lens_probabilities        FP32 [batch, states, positions, k]
  lens_target_probabilities FP32 [batch, states, positions, targets]
  attribution_heads             FP32 [batch, positions, targets, layers, heads]
  attribution_attention_biases  FP32 [batch, positions, targets, layers]
  attribution_mlps              FP32 [batch, positions, targets, layers]
  attribution_embeddings        FP32 [batch, positions, targets]
  attribution_constants         FP32 [batch, positions, targets]
                                (parameter attribution_target_ids)
  sae_top_ids                   INT64 [batch, positions, k]  strongest first (parameter sae)
  sae_top_activations           FP32 [batch, positions, k]
  sae_l0                        INT64 [batch, positions]
  sae_error_norm                FP32 [batch, positions]
  sae_feature_activations       FP32 [batch, positions, ids]  (parameter sae_feature_ids)
  sae_activations               FP32 [batch, positions, d_sae]
  patching                      FP32 [batch, layers, positions or heads]  (parameters
                                patching_source, _hook, _target_id, _contrast_id)
  patching_clean, patching_corrupted  FP32 [batch]
  patching_saliency             FP32 [batch, positions]  (patching_method attribution)
Options are request parameters, each setting the options its row of the one table says
(service/oip/parameters.py PARAMETERS); the outputs asked say which groups of options are
computed.
Ragged results are zero-padded to the longest row (-1 for token ids predicted,
attention_indices and sae_top_ids).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.oip.wire import BYTES
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.request import (
    EncodeOptions,
    HeadScale,
    Input,
    Intervention,
    Pooling,
)
from attnserve.service.oip.messages import InferRequest, InputTensor
from attnserve.service.oip.outputs import (
    OPTION_GROUPS,
    OUTPUT_DATATYPES,
    READOUT_OUTPUTS,
    STATISTICS_OUTPUTS,
)
from attnserve.service.oip.parameters import (
    PARAMETERS,
    STEERING_PARAMETERS,
    checked_parameters,
)

INPUTS = {  # name: (datatype, rank)
    "input_ids": ("INT64", 2),
    "input_lengths": ("INT64", 1),
    "text": (BYTES, 1),
    "head_mask": ("FP32", 2),
    "head_means": ("FP32", 3),
    "steering": ("FP32", 1),
}
_INPUT_SHAPES = {1: "[batch]", 2: "[batch, seq]"}
_HEAD_SHAPES = {"head_mask": "[layers, heads]", "head_means": "[layers, heads, head_dim]"}
_OWN_SHAPES = _HEAD_SHAPES | {"steering": "[width]"}


@dataclass(frozen=True)
class InferPlan:
    """What a ModelInfer request asks of the data plane, and the outputs, in order."""

    inputs: list[Input]  # texts, or rows of ids (int64)
    options: EncodeOptions
    outputs: list[str]


def check_input(index: int, tensor: InputTensor) -> None:
    """An input's name, datatype and shape against the model's; the data is read after."""
    field = f"inputs[{index}]"
    if tensor.name not in INPUTS:
        raise InvalidInputError(
            f"{field}.name: unknown input {tensor.name!r}; this model takes "
            + ", ".join(f"{n} ({d})" for n, (d, _) in INPUTS.items())
        )
    datatype, rank = INPUTS[tensor.name]
    if tensor.datatype != datatype:
        raise InvalidInputError(
            f"{field}.datatype: {tensor.name} must be {datatype}, got {tensor.datatype!r}"
        )
    shape = tensor.shape
    if len(shape) != rank or any(d < 1 for d in shape):
        dims = _OWN_SHAPES.get(tensor.name) or _INPUT_SHAPES[rank]
        raise InvalidInputError(
            f"{field}.shape: {tensor.name} needs {rank} dimensions of at least 1 "
            f"({dims}), got {list(shape)}"
        )
    if datatype == BYTES and tensor.data is not None and len(tensor.data) != shape[0]:
        raise InvalidInputError(
            f"{field}: shape {list(shape)} holds {shape[0]} strings, got {len(tensor.data)}"
        )


def translate(request: InferRequest, config: ModelConfig) -> InferPlan:
    """Translate a request whose inputs hold their data (the ids themselves are checked by
    the data plane's plan, as Encode's are); InvalidInputError names the field."""
    values = _read_inputs(request)
    head_mask, head_means = values.pop("head_mask", None), values.pop("head_means", None)
    params = checked_parameters(request.parameters)
    steering = _steering(values.pop("steering", None), params)
    outputs = _requested_outputs(request, params)

    inputs: list[Input]
    if "input_ids" in values and not any(values.get("text", [b""])):
        values.pop("text", None)  # texts all empty: what perf_analyzer sends for "no text"
    if "text" in values:
        if "input_ids" in values or "input_lengths" in values:
            raise InvalidInputError("inputs: give either text or input_ids, not both")
        try:
            inputs = [value.decode("utf-8") for value in values["text"]]
        except UnicodeDecodeError as exc:
            raise InvalidInputError(f"inputs: text is not UTF-8 ({exc.reason})") from None
    elif "input_ids" in values:
        inputs = _rows(values["input_ids"], values.get("input_lengths"))
    else:
        raise InvalidInputError(
            "inputs: give input_ids (INT64 [batch, seq], with input_lengths INT64 [batch] "
            "for ragged rows) or text (BYTES [batch])"
        )

    mask = (
        ()
        if head_mask is None and head_means is None
        else _head_mask(head_mask, head_means, config)
    )
    options = replace(_options(params, outputs, mask), interventions=steering)
    return InferPlan(inputs, options, outputs)


def _steering(values: np.ndarray | None, params: dict[str, Any]) -> tuple[Intervention, ...]:
    """The steering input as one intervention (its parameters taken out of `params`)."""
    given = {name: params.pop(name) for name in STEERING_PARAMETERS if name in params}
    if values is None:
        if given:
            raise InvalidInputError(f"parameters: {', '.join(given)} needs the steering input")
        return ()
    if "steering_hook" not in given:
        raise InvalidInputError("parameters: the steering input needs steering_hook")
    return (
        Intervention(
            hook=given["steering_hook"],
            op="add",
            values=values,
            scale=given.get("steering_scale"),
            positions=given.get("steering_positions", ()),
        ),
    )


def _options(
    params: dict[str, Any], outputs: list[str], head_mask: tuple[HeadScale, ...]
) -> EncodeOptions:
    """Each parameter into the options its row of PARAMETERS names, in the groups the
    outputs ask for (a parameter of no asked group is refused); what the outputs say
    themselves (which tensors, entropy, norms, logits) beside."""
    asked = set(outputs)
    groups = {group for group, (names, _) in OPTION_GROUPS.items() if asked & set(names)}
    values: dict[str, dict[str, Any]] = defaultdict(dict)  # group ("": none) -> option -> value
    for name, value in params.items():
        fields = [f.removeprefix("options.").rpartition(".") for f in PARAMETERS[name].fields]
        if not any(not group or group in groups for group, _, _ in fields):
            wanted = [o for group, _, _ in fields for o in OPTION_GROUPS[group][0]]
            raise InvalidInputError(
                f"parameters: {name} needs one of the outputs {', '.join(wanted)}"
            )
        for group, _, option in fields:
            if not group or group in groups:
                values[group][option] = value
    top = values.pop("", {})
    if "pooled" in asked:
        top.setdefault("pooling", Pooling.LAST)
        if top["pooling"] == Pooling.NONE:
            raise InvalidInputError("parameters: pooling=none, but the pooled output was asked")
    else:
        top["pooling"] = Pooling.NONE
    if "attention" in groups:
        values["attention"] |= {
            "head_entropy": "head_entropy" in asked,
            "row_entropy": "attention_row_entropy" in asked,
            "received": "attention_received" in asked,
            "omit_weights": "attention" not in asked,
        }
        if "attention_indices" in asked and not values["attention"].get("top_k"):
            raise InvalidInputError("outputs: attention_indices needs the top_k parameter")
    if "hidden_states" in groups:
        values["hidden_states"] |= {
            "norms": "hidden_state_norms" in asked,
            "omit_states": "hidden_states" not in asked,
        }
    if "predictions" in groups:
        values["predictions"]["logits"] = "logits" in asked
    for target_output, group in (
        ("target_probabilities", "predictions"),
        ("lens_target_probabilities", "logit_lens"),
    ):
        if target_output in asked and not values[group].get("target_ids"):
            raise InvalidInputError(f"outputs: {target_output} needs the target_ids parameter")
    if "attribution" in groups and not values["attribution"].get("target_ids"):
        raise InvalidInputError(
            "outputs: the attribution outputs need the attribution_target_ids parameter"
        )
    if "patching" in groups:
        needed = [n for n in PARAMETERS if n.startswith("patching_") and n != "patching_method"]
        missing = [n for n in needed if n not in params]
        if missing:
            raise InvalidInputError(f"outputs: the patching outputs need {', '.join(missing)}")
        if "patching_saliency" in asked and params.get("patching_method") != "attribution":
            raise InvalidInputError(
                "outputs: patching_saliency comes with parameter patching_method attribution"
            )
    if "features" in groups:
        features = values["features"]
        if "saes" not in features:
            raise InvalidInputError("outputs: the sae outputs need the sae parameter")
        features |= {"saes": (features["saes"],), "dense": "sae_activations" in asked}
        features["skip_error_norm"] = "sae_error_norm" not in asked  # its decoder unread
        if "sae_feature_activations" in asked and not features.get("feature_ids"):
            raise InvalidInputError(
                "outputs: sae_feature_activations needs the sae_feature_ids parameter"
            )
    options = {group: OPTION_GROUPS[group][1](**values[group]) for group in groups}
    return EncodeOptions(
        **top, token_embeddings="embeddings" in asked, head_mask=head_mask, **options
    )


def _head_mask(
    mask: np.ndarray | None, means: np.ndarray | None, config: ModelConfig
) -> tuple[HeadScale, ...]:
    """A HeadScale for each head whose scale is not 1 or whose mean is not zero."""
    heads = (config.n_layers, config.n_heads)
    for name, values, shape in (
        ("head_mask", mask, heads),
        ("head_means", means, (*heads, config.head_dim)),
    ):
        if values is not None and values.shape != shape:
            raise InvalidInputError(
                f"inputs: {name} has shape {list(values.shape)}, this model's is "
                f"{list(shape)} ({_HEAD_SHAPES[name][1:-1]})"
            )
    mask = np.ones(heads, np.float32) if mask is None else mask
    moved = np.zeros(heads, bool) if means is None else (means != 0).any(-1)
    return tuple(
        HeadScale(
            int(layer),
            int(head),
            float(mask[layer, head]),
            tuple(means[layer, head].tolist()) if means is not None and moved[layer, head] else (),
        )
        for layer, head in np.argwhere((mask != 1) | moved)
    )


def _read_inputs(request: InferRequest) -> dict:
    values: dict = {}
    for i, tensor in enumerate(request.inputs):
        check_input(i, tensor)
        if tensor.name in values:
            raise InvalidInputError(f"inputs[{i}].name: {tensor.name} given twice")
        values[tensor.name] = tensor.data
    return values


def _rows(ids: np.ndarray, lengths: np.ndarray | None) -> list[Input]:
    batch, seq = ids.shape
    if lengths is None:
        return list(ids)
    if lengths.shape != (batch,):
        raise InvalidInputError(
            f"inputs: input_lengths has shape {list(lengths.shape)}, input_ids has {batch} rows"
        )
    bad = [int(n) for n in lengths if not 1 <= n <= seq]
    if bad:
        raise InvalidInputError(
            f"inputs: input_lengths must be in [1, {seq}] (the rows' width), got {bad[0]}"
        )
    return [row[:n] for row, n in zip(ids, lengths, strict=True)]


def _requested_outputs(request: InferRequest, params: dict[str, object]) -> list[str]:
    """The outputs asked for, or, as the protocol says of "outputs": "Optional, if not
    specified all outputs produced by the model will be returned" (attention_indices is
    produced only with top_k)."""
    if not request.outputs:
        return [
            n
            for n in OUTPUT_DATATYPES
            if n not in READOUT_OUTPUTS + STATISTICS_OUTPUTS
            and (n != "attention_indices" or "top_k" in params)
        ]
    names = [o.name for o in request.outputs]
    for i, name in enumerate(names):
        if name not in OUTPUT_DATATYPES:
            raise InvalidInputError(
                f"outputs[{i}].name: unknown output {name!r}; this model has "
                + ", ".join(OUTPUT_DATATYPES)
            )
        if names.index(name) != i:
            raise InvalidInputError(f"outputs[{i}].name: {name} asked twice")
    return names
