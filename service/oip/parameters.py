"""The request parameters of the encoder's Open Inference Protocol model, in one table: their
names, types, help and the option each sets; how a request's are read (each of its type,
never converted; unknown ones refused, the ones clients send on their own ignored)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from attnserve.oip.wire import Parameter
from attnserve.service.core.errors import InvalidInputError, fields_named
from attnserve.service.core.request import HeadReduction, Layout, LensNorm, Pooling

# Parameters that clients of the protocol send on their own (Triton reserves the prefix
# "triton_"; perf_analyzer sends triton_enable_empty_final_response); they change nothing.
IGNORED_PARAMETERS = frozenset({"priority", "timeout", "sequence_id", "sequence_start"})
IGNORED_PARAMETERS |= {"sequence_end", "binary_data_output"}
IGNORED_PREFIX = "triton_"


@dataclass(frozen=True)
class ParameterSpec:
    kind: type  # bool, int, float, str, or list (comma-separated ints, or one int)
    help: str
    # the options it sets (core/request.py's EncodeOptions, "options.attention.layers"):
    # the data plane's errors name those, and a V2 client reads the parameter's name
    # instead (parameter_names)
    fields: tuple[str, ...] = ()
    choices: Mapping[str, Any] | None = None  # a string's value by its word (any case)


def _spec(kind: type, help: str, *fields: str) -> ParameterSpec:
    """A parameter of `kind`; a StrEnum's is a string, one of its words."""
    options = tuple(f"options.{field}" for field in fields)
    if issubclass(kind, StrEnum):
        words: list[StrEnum] = list(kind)
        return ParameterSpec(str, help, options, {word.value: word for word in words})
    return ParameterSpec(kind, help, options)


PARAMETERS = {
    "pooling": _spec(Pooling, "none | mean | last (the pooled output; default last)", "pooling"),
    "truncate": _spec(bool, "cut text or ids longer than max_seq_len instead of refusing",
                      "truncate"),
    "attention_layers": _spec(list, "layers, comma-separated; -1 is the last (default all)",
                              "attention.layers"),
    "attention_heads": _spec(list, "heads, comma-separated (default all)", "attention.heads"),
    "attention_rows": _spec(list, "query positions, comma-separated; -1 is the last",
                            "attention.query_positions"),
    "attention_dtype": ParameterSpec(str, "FP32 (default) | FP16",
                                     ("options.attention.float16",), {"FP32": False, "FP16": True}),
    "attention_layout": _spec(Layout, "full (default) | causal_packed", "attention.layout"),
    "head_reduction": _spec(HeadReduction, "none | mean | max", "attention.head_reduction"),
    "rollout": _spec(bool, "attention rollout over the selected layers", "attention.rollout"),
    "top_k": _spec(int, "keep the k largest weights per row", "attention.top_k"),
    "attention_key_start": _spec(int, "a tile: the first key of each row's weights",
                                 "attention.key_start"),
    "attention_key_end": _spec(int, "a tile: the key after its last (default 0: T)",
                               "attention.key_end"),
    "hidden_layers": _spec(list, "hidden states 0..L, comma-separated; -1 is the last (all)",
                           "hidden_states.layers"),
    "hidden_positions": _spec(list, "their positions; -1 is the last (default all)",
                              "hidden_states.positions"),
    "prediction_positions": _spec(list, "positions predicted from (default all)",
                                  "predictions.positions"),
    "lens_layers": _spec(list, "logit-lens states 0..L, comma-separated; -1 is the last (all)",
                         "logit_lens.layers"),
    "lens_positions": _spec(list, "logit-lens positions; -1 is the last (default all)",
                            "logit_lens.positions"),
    "lens_norm": _spec(LensNorm, "frozen (the last state's scale, default) | own (each state's)",
                       "logit_lens.lens_norm"),
    "top_tokens": _spec(int, "how many most probable tokens (default 5)", "predictions.top_k",
                        "logit_lens.top_k"),
    "target_ids": _spec(list, "token ids whose probabilities to return",
                        "predictions.target_ids", "logit_lens.target_ids"),
    "attribution_positions": _spec(list, "positions attributed; -1 is the last (all)",
                                   "attribution.positions"),
    "attribution_target_ids": _spec(list, "token ids whose logits to attribute",
                                    "attribution.target_ids"),
    "attribution_contrast_ids": _spec(list, "one per target: attribute the difference",
                                      "attribution.contrast_ids"),
    "sae": _spec(str, "the SAE whose features to return (GetModelInfo's saes)", "features.saes"),
    "sae_top_k": _spec(int, "how many strongest features per position (default 10)",
                       "features.top_k"),
    "sae_positions": _spec(list, "positions read; -1 is the last (default all)",
                           "features.positions"),
    "sae_feature_ids": _spec(list, "features whose activations to return",
                             "features.feature_ids"),
    "sae_skip_first_token": _spec(bool, "leave position 0 out (its activations are outliers)",
                                  "features.skip_first_token"),
    "patching_source": _spec(str, "the clean text each input is patched from",
                             "patching.source"),
    "patching_hook": _spec(str, "resid_pre | attn_out | resid_mid | mlp_out | resid_post | z",
                           "patching.hook"),
    "patching_target_id": _spec(int, "the token whose logit difference is read",
                                "patching.target"),
    "patching_contrast_id": _spec(int, "the token whose logit is subtracted",
                                  "patching.contrast"),
    "patching_method": _spec(str, "activation (default) | attribution: its linear estimate",
                             "patching.method"),
    # the steering input's: its one intervention is made in translate (tensors.py)
    "steering_hook": _spec(str, "the site the steering input is added to (required with it)",
                           "interventions[0].hook"),
    "steering_scale": _spec(float, "the steering input's strength (default 1)",
                            "interventions[0].scale"),
    "steering_positions": _spec(list, "positions steered; -1 is the last (default all)",
                                "interventions[0].positions"),
}  # fmt: skip
STEERING_PARAMETERS = ("steering_hook", "steering_scale", "steering_positions")
# an option's field path -> the V2 parameter (or input) that sets it
_PARAMETER_OF = {
    field: f"parameters.{name}" for name, spec in PARAMETERS.items() for field in spec.fields
} | {"options.interventions[0].values": "inputs.steering"}


def parameter_names() -> AbstractContextManager[None]:
    """Errors raised inside name the V2 parameter a client sent where they named the option
    it set ("parameters.lens_layers: 7 is outside ..." rather than
    "options.logit_lens.layers: ...")."""
    return fields_named(_PARAMETER_OF)


def checked_parameters(parameters: dict[str, Parameter]) -> dict[str, Any]:
    """A request's parameters (as the wire read them) checked against PARAMETERS: each of its
    type (a choice's value for its word, a list as a tuple), unknown ones refused, the ones
    clients send on their own left out."""
    out: dict[str, Any] = {}
    for name, value in parameters.items():
        if name in IGNORED_PARAMETERS or name.startswith(IGNORED_PREFIX):
            continue
        spec = PARAMETERS.get(name)
        if spec is None:
            raise InvalidInputError(
                f"parameters: unknown parameter {name!r}; known: {', '.join(PARAMETERS)}"
            )
        out[name] = _value(name, value, spec)
    return out


def _value(name: str, value: Parameter, spec: ParameterSpec) -> object:
    """`value` if it is of the parameter's type; never coerced (a bool is not an integer)."""
    kind = spec.kind
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and is_int:
        return value
    if kind is float and (is_int or isinstance(value, float)):
        return float(value)
    if kind is str and isinstance(value, str):
        return value if spec.choices is None else _choice(name, value, spec.choices)
    if kind is list:
        if is_int:
            return (value,)
        if isinstance(value, str):
            try:
                return tuple(int(part) for part in value.split(",") if part.strip())
            except ValueError:
                pass
    expected = {bool: "a bool", int: "an integer", float: "a number", str: "a string"}
    expected[list] = "comma-separated ints"
    raise InvalidInputError(
        f"parameters.{name}: must be {expected[kind]}, got {type(value).__name__} {value!r}"
    )


def _choice(name: str, word: str, choices: Mapping[str, Any]) -> object:
    by_word = {key.lower(): value for key, value in choices.items()}
    if word.lower() not in by_word:
        raise InvalidInputError(f"parameters: {name} must be one of {list(choices)}, got {word!r}")
    return by_word[word.lower()]
