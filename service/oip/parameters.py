"""The request parameters of the encoder's Open Inference Protocol model: their names, types
and help, and how a request's are read (each of its type, never converted; unknown ones
refused, the ones clients send on their own ignored)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from attnserve.oip.wire import Parameter
from attnserve.service.core.errors import AttnserveError, InvalidInputError

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
    # the attnserve.v1 fields it sets: the data plane's errors name those, and a V2 client
    # reads the parameter's name instead (parameter_names)
    fields: tuple[str, ...] = ()


def _spec(kind: type, help: str, *fields: str) -> ParameterSpec:
    return ParameterSpec(kind, help, tuple(f"options.{field}" for field in fields))


PARAMETERS = {
    "pooling": _spec(str, "none | mean | last (the pooled output; default last)", "pooling"),
    "truncate": _spec(bool, "cut text or ids longer than max_seq_len instead of refusing"),
    "attention_layers": _spec(list, "layers, comma-separated; -1 is the last (default all)",
                              "attention.layers"),
    "attention_heads": _spec(list, "heads, comma-separated (default all)", "attention.heads"),
    "attention_rows": _spec(list, "query positions, comma-separated; -1 is the last",
                            "attention.query_positions"),
    "attention_dtype": _spec(str, "FP32 (default) | FP16", "attention.dtype"),
    "attention_layout": _spec(str, "full (default) | causal_packed", "attention.layout"),
    "head_reduction": _spec(str, "none | mean | max", "attention.head_reduction"),
    "rollout": _spec(bool, "attention rollout over the selected layers", "attention.rollout"),
    "top_k": _spec(int, "keep the k largest weights per row", "attention.top_k"),
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
    "lens_norm": _spec(str, "frozen (the last state's scale, default) | own (each state's)",
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
}  # fmt: skip
# attnserve.v1 field -> the V2 parameter that sets it, longest first (a field's name may
# begin another's)
_PARAMETER_OF = dict(
    sorted(
        (
            (field, f"parameters.{name}")
            for name, spec in PARAMETERS.items()
            for field in spec.fields
        ),
        key=lambda item: -len(item[0]),
    )
)


@contextmanager
def parameter_names() -> Iterator[None]:
    """Errors raised inside name the V2 parameter a client sent where they named the
    attnserve.v1 field it set ("parameters.lens_layers: 7 is outside ..." rather than
    "options.logit_lens.layers: ...")."""
    try:
        yield
    except AttnserveError as exc:
        message = str(exc)
        for field, parameter in _PARAMETER_OF.items():
            message = message.replace(field, parameter)
        if message == str(exc):
            raise
        raise type(exc)(message) from exc


def checked_parameters(parameters: dict[str, Parameter]) -> dict[str, Any]:
    """A request's parameters (as the wire read them) checked against PARAMETERS: each of its
    type, unknown ones refused, the ones clients send on their own left out."""
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
