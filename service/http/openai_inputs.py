"""OpenAI's `input` (embeddings) and `prompt` (completions): a text, texts, a token array or
token arrays, as the data plane takes them."""

from __future__ import annotations

from typing import cast

import numpy as np

from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.fields import INT64
from attnserve.service.core.request import Input


def openai_inputs(field: str, given: str | list[str] | list[int] | list[list[int]]) -> list[Input]:
    """Each text, or each token array as int64 ids; InvalidInputError names `field`."""
    single = isinstance(given, str) or (len(given) > 0 and isinstance(given[0], int))
    items = cast(list[str | list[int]], [given] if single else given)
    if not items:
        raise InvalidInputError(f"{field}: at least one {field} is required")
    inputs: list[Input] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            inputs.append(item)
            continue
        token = next((t for t in item if t not in INT64), None)
        if token is not None:
            raise InvalidInputError(
                f"{field}[{i}]: token id {token} is out of range (token ids are int64)"
            )
        inputs.append(np.array(item, dtype=np.int64))
    return inputs
