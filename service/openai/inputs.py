"""OpenAI's `input` (embeddings) and `prompt` (completions): a text, texts, a token array or
token arrays, as the data plane takes them; and vLLM's `truncate_prompt_tokens`, the one
way these endpoints cut a prompt to the model's context."""

from __future__ import annotations

from typing import cast

import numpy as np

from attnserve.model.tokenizer import Tokenizer
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.fields import INT64
from attnserve.service.core.request import Input


def openai_inputs(
    field: str, given: str | list[str] | list[int] | list[list[int]], empty_text: bool = True
) -> list[Input]:
    """Each text, or each token array as int64 ids; InvalidInputError names `field`.
    `empty_text` False: an empty text is refused (an embedding of nothing)."""
    single = isinstance(given, str) or (len(given) > 0 and isinstance(given[0], int))
    items = cast(list[str | list[int]], [given] if single else given)
    if not items:
        raise InvalidInputError(f"{field}: at least one {field} is required")
    inputs: list[Input] = []
    for i, item in enumerate(items):
        name = field if single else f"{field}[{i}]"
        if isinstance(item, str):
            if not item and not empty_text:
                raise InvalidInputError(f"{name}: the text is empty")
            inputs.append(item)
            continue
        token = next((t for t in item if t not in INT64), None)
        if token is not None:
            raise InvalidInputError(
                f"{name}: token id {token} is out of range (token ids are int64)"
            )
        inputs.append(np.array(item, dtype=np.int64))
    return inputs


def fitted(
    field: str,
    inputs: list[Input],
    tokenizer: Tokenizer,
    keep: int | None,
    limit: tuple[int, str],
) -> list[np.ndarray]:
    """Each input's ids (a text tokenized), cut to its last `keep` tokens where asked (a
    text's leading special tokens kept, as vLLM keeps them); one longer than `limit` (the
    tokens, and why) is refused, naming what would cut it."""
    if keep is not None and keep < 1:
        raise InvalidInputError(f"truncate_prompt_tokens: {keep} is not >= 1")
    most, why = limit
    out: list[np.ndarray] = []
    for i, item in enumerate(inputs):
        name = field if len(inputs) == 1 else f"{field}[{i}]"
        lead = len(tokenizer.encode("")) if isinstance(item, str) else 0  # BOS, where written
        ids = np.asarray(tokenizer.encode(item) if isinstance(item, str) else item, np.int64)
        if keep is not None and len(ids) > keep:
            lead = min(lead, keep - 1)
            ids = np.concatenate((ids[:lead], ids[len(ids) - (keep - lead) :]))
        if len(ids) > most:
            raise InvalidInputError(
                f"{name} has {len(ids)} tokens, more than {most} ({why}); send fewer or set "
                "truncate_prompt_tokens"
            )
        out.append(ids)
    return out
