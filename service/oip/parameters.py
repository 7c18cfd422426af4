"""The request parameters of the encoder's Open Inference Protocol model: their names, types
and help, and how a request's are read (each of its type, never converted; unknown ones
refused, the ones clients send on their own ignored)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from attnserve.oip.wire import Parameter
from attnserve.service.core.errors import InvalidInputError

Choice = TypeVar("Choice")  # an enum value of the .proto

# Parameters that clients of the protocol send on their own (Triton reserves the prefix
# "triton_"; perf_analyzer sends triton_enable_empty_final_response); they change nothing.
IGNORED_PARAMETERS = frozenset({"priority", "timeout", "sequence_id", "sequence_start"})
IGNORED_PARAMETERS |= {"sequence_end", "binary_data_output"}
IGNORED_PREFIX = "triton_"


@dataclass(frozen=True)
class ParameterSpec:
    kind: type  # bool, int, str, or list (comma-separated ints, or one int)
    help: str


PARAMETERS = {
    "pooling": ParameterSpec(str, "none | mean | last (the pooled output; default last)"),
    "truncate": ParameterSpec(bool, "cut text or ids longer than max_seq_len instead of refusing"),
    "attention_layers": ParameterSpec(list, "layers, comma-separated (default all)"),
    "attention_heads": ParameterSpec(list, "heads, comma-separated (default all)"),
    "attention_rows": ParameterSpec(list, "query positions, comma-separated; -1 is the last"),
    "attention_dtype": ParameterSpec(str, "FP32 (default) | FP16"),
    "attention_layout": ParameterSpec(str, "full (default) | causal_packed"),
    "head_reduction": ParameterSpec(str, "none | mean | max"),
    "rollout": ParameterSpec(bool, "attention rollout over the selected layers"),
    "top_k": ParameterSpec(int, "keep the k largest weights per row"),
    "hidden_layers": ParameterSpec(list, "hidden states 0..L, comma-separated (default all)"),
    "hidden_positions": ParameterSpec(list, "their positions; -1 is the last (default all)"),
    "prediction_positions": ParameterSpec(list, "positions predicted from (default all)"),
    "lens_layers": ParameterSpec(list, "logit-lens states 0..L, comma-separated (default all)"),
    "lens_positions": ParameterSpec(list, "logit-lens positions; -1 is the last (default all)"),
    "top_tokens": ParameterSpec(int, "how many most probable tokens (default 5)"),
    "target_ids": ParameterSpec(list, "token ids whose probabilities to return"),
    "attribution_positions": ParameterSpec(list, "positions attributed; -1 is the last (all)"),
    "attribution_target_ids": ParameterSpec(list, "token ids whose logits to attribute"),
    "attribution_contrast_ids": ParameterSpec(list, "one per target: attribute the difference"),
}


def read_parameters(parameters: dict[str, Parameter]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in parameters.items():
        if name in IGNORED_PARAMETERS or name.startswith(IGNORED_PREFIX):
            continue
        spec = PARAMETERS.get(name)
        if spec is None:
            raise InvalidInputError(
                f"parameters: unknown parameter {name!r}; known: {', '.join(PARAMETERS)}"
            )
        out[name] = _value(name, value, spec.kind)
    return out


def _value(name: str, value: Parameter, kind: type) -> object:
    """`value` if it is of the parameter's type; never coerced (a bool is not an integer)."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and is_int:
        return value
    if kind is str and isinstance(value, str):
        return value
    if kind is list:
        if is_int:
            return [value]
        if isinstance(value, str):
            try:
                return [int(part) for part in value.split(",") if part.strip()]
            except ValueError:
                pass
    expected = {bool: "a bool", int: "an integer", str: "a string", list: "comma-separated ints"}
    raise InvalidInputError(
        f"parameters.{name}: must be {expected[kind]}, got {type(value).__name__} {value!r}"
    )


def choice(name: str, value: str, choices: Mapping[str, Choice]) -> Choice:
    key = value.lower() if name != "attention_dtype" else value.upper()
    if key not in choices:
        raise InvalidInputError(f"parameters: {name} must be one of {list(choices)}, got {value!r}")
    return choices[key]
