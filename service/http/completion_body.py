"""OpenAI's completions request and answer (POST /v1/completions), as its SDK sends and reads
them, with vLLM's `stop_token_ids`, `ignore_eos` and `return_token_ids` and attnserve's
`interventions` and `compare`: the body parsed into the data plane's generation options,
and the tokens made into choices and stream chunks."""

from __future__ import annotations

import secrets
from typing import Literal, cast

import numpy as np
from pydantic import BaseModel, Field

from attnserve.model.tokenizer import Tokenizer
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.fields import INT64
from attnserve.service.core.generation import Token
from attnserve.service.core.generation_plan import GenerateOptions
from attnserve.service.core.request import Input, Intervention


class FeatureBody(BaseModel):
    sae: str = Field(description="an SAE the model serves (GET /v1/model-info's saes)")
    feature_id: int


class InterventionBody(BaseModel):
    """attnserve's change of a hook site, as attnserve.v1's Intervention in JSON: `values` a
    list of floats (one vector, or one per position)."""

    hook: str = Field("", description="TransformerLens' name: blocks.3.hook_resid_pre")
    op: Literal["add", "set", "scale"] = "add"
    values: list[float] | list[list[float]] | None = None
    scale: float | None = Field(None, description="add, set: times the values; scale: the factor")
    positions: list[int] = Field(
        default_factory=list, description="prompt positions; none: every position, generated too"
    )
    heads: list[int] = Field(default_factory=list, description="hook_z, q, k, v: heads changed")
    feature: FeatureBody | None = Field(None, description="steer along an SAE feature's decoder")


class StreamOptions(BaseModel):
    include_usage: bool = False


class CompletionRequest(BaseModel):
    """OpenAI's completion request (its parameters this server honours; `n`, `echo`, `best_of`,
    the penalties and `logit_bias` only at their defaults)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    model: str | None = Field(None, description="the served model's name (GET /v1/models)")
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: int | None = None
    echo: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    suffix: str | None = None
    # vLLM's
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    return_token_ids: bool = False
    # attnserve's
    interventions: list[InterventionBody] = Field(default_factory=list)
    compare: bool = Field(
        False, description="each prompt's completion with and without the interventions"
    )


def completion_choices(body: CompletionRequest) -> list[tuple[Input, GenerateOptions]]:
    """Each choice's prompt and options: a choice per prompt, two with `compare` (the
    interventions' and the plain one, in that order)."""
    unsupported = {
        "n": body.n != 1,
        "echo": body.echo,
        "best_of": body.best_of not in (None, 1),
        "presence_penalty": body.presence_penalty != 0.0,
        "frequency_penalty": body.frequency_penalty != 0.0,
        "logit_bias": bool(body.logit_bias),
        "suffix": body.suffix is not None,
    }
    for name, given in unsupported.items():
        if given:
            raise InvalidInputError(f"{name}: only its default is served")
    if body.compare and not body.interventions:
        raise InvalidInputError("compare: name interventions to compare the completion with")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    options = GenerateOptions(
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=stop,
        stop_token_ids=tuple(body.stop_token_ids),
        ignore_eos=body.ignore_eos,
        logprobs=body.logprobs,
        interventions=tuple(
            _intervention(f"interventions[{i}]", e) for i, e in enumerate(body.interventions)
        ),
    )
    plain = GenerateOptions(**{**options.__dict__, "interventions": ()})
    choices: list[tuple[Input, GenerateOptions]] = []
    for prompt in _prompts(body.prompt):
        choices.append((prompt, options))
        if body.compare:
            choices.append((prompt, plain))
    return choices


def _prompts(given: str | list[str] | list[int] | list[list[int]]) -> list[Input]:
    single = isinstance(given, str) or (len(given) > 0 and isinstance(given[0], int))
    items = cast(list[str | list[int]], [given] if single else given)
    if not items:
        raise InvalidInputError("prompt: at least one prompt is required")
    prompts: list[Input] = []
    for i, item in enumerate(items):
        if not isinstance(item, str) and any(t not in INT64 for t in item):
            raise InvalidInputError(f"prompt[{i}]: a token id is out of range (ids are int64)")
        prompts.append(item if isinstance(item, str) else np.array(item, dtype=np.int64))
    return prompts


def _intervention(field: str, entry: InterventionBody) -> Intervention:
    values = None
    if entry.values is not None:
        values = np.asarray(entry.values, dtype=np.float32)
        if values.ndim not in (1, 2) or values.size == 0:
            raise InvalidInputError(f"{field}.values: one vector, or one per position")
    return Intervention(
        hook=entry.hook,
        op=entry.op,
        values=values,
        scale=entry.scale,
        positions=tuple(entry.positions),
        heads=tuple(entry.heads),
        feature=(entry.feature.sae, entry.feature.feature_id) if entry.feature else None,
    )


class Completion:
    """One choice's answer as its tokens come: the text, the finish reason, the ids and the
    log-probabilities in OpenAI's `logprobs` shape."""

    def __init__(self, index: int, tokenizer: Tokenizer, body: CompletionRequest) -> None:
        self.index = index
        self.tokenizer = tokenizer
        self.body = body
        self.text = ""
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.logprobs: dict[str, list] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }

    def add(self, token: Token) -> dict:
        """Take one token; -> its stream chunk's choice (what it adds)."""
        offset = len(self.text)
        self.text += token.text
        self.token_ids.append(token.token_id)
        self.finish_reason = token.finish_reason
        added: dict[str, list] = {key: [] for key in self.logprobs}
        if token.logprob is not None:
            added["tokens"].append(self._token_text(token.token_id))
            added["token_logprobs"].append(token.logprob)
            added["top_logprobs"].append(
                {self._token_text(i): lp for i, lp in token.top} if token.top else None
            )
            added["text_offset"].append(offset)
            for key, values in added.items():
                self.logprobs[key] += values
        return self._choice(token.text, added, [token.token_id], token.finish_reason)

    def _token_text(self, token_id: int) -> str:
        """A token's text, or where it is part of a character its bytes ("<0xF0>"): the
        alternatives' keys stay apart."""
        text = self.tokenizer.decode([token_id])
        if not text or "\ufffd" in text:
            return self.tokenizer.token_strings([token_id])[0]
        return text

    def choice(self) -> dict:
        """The whole choice (the answer without `stream`)."""
        return self._choice(self.text, self.logprobs, self.token_ids, self.finish_reason)

    def _choice(
        self, text: str, logprobs: dict[str, list], ids: list[int], finish: str | None
    ) -> dict:
        choice: dict = {
            "index": self.index,
            "text": text,
            "logprobs": logprobs if self.body.logprobs is not None else None,
            "finish_reason": finish,
        }
        if self.body.return_token_ids:
            choice["token_ids"] = ids
        return choice


def completion_id() -> str:
    return f"cmpl-{secrets.token_hex(12)}"
