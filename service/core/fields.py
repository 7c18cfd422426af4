"""Request fields checked one way everywhere: enums, index lists and token positions, each
refused with the field's name and the limit it breaks."""

from __future__ import annotations

from collections.abc import Iterable

from attnserve.service.core.errors import InvalidInputError

INT64 = range(-(2**63), 2**63)  # `value in INT64`: constant time for an int


def indices(name: str, values: Iterable[int], limit: int) -> list[int]:
    """Distinct indices in [0, limit) from indices in [-limit, limit), negative counting from
    the end as positions do (-1: the last layer or state); none given means all of them."""
    given = list(values)
    for v in given:
        if not -limit <= v < limit:
            raise InvalidInputError(f"{name}: {v} is outside [-{limit}, {limit})")
    chosen = [v % limit for v in given] or list(range(limit))
    if len(set(chosen)) != len(chosen):
        raise InvalidInputError(f"{name}: {given} repeats an index")
    return chosen


def positions(name: str, values: Iterable[int], length: int, index: int) -> tuple[int, ...]:
    """Distinct absolute positions of inputs[index] (`length` tokens) from positions in
    [-length, length), negative counting from the end."""
    values = list(values)
    rows = []
    for q in values:
        if not -length <= q < length:
            raise InvalidInputError(
                f"{name}: {q} is outside [-{length}, {length}) for inputs[{index}], "
                f"which has {length} tokens"
            )
        rows.append(q % length)
    if len(set(rows)) != len(rows):
        raise InvalidInputError(
            f"{name}: {values} name the same position twice in inputs[{index}] ({length} tokens)"
        )
    return tuple(rows)
