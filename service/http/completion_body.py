"""OpenAI's completions request and answer (POST /v1/completions), as its SDK sends and reads
them, with vLLM's `stop_token_ids`, `ignore_eos` and `return_token_ids` and attnserve's
`interventions` and `compare`: the body parsed into the data plane's generation options,
and the tokens made into choices and stream chunks."""

from __future__ import annotations

import difflib
from dataclasses import replace
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from attnserve.model.tokenizer import Tokenizer
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.request import GenerateOptions, Input, Intervention
from attnserve.service.generate.chat import ChatTemplate
from attnserve.service.generate.output import Token
from attnserve.service.http.openai_inputs import fitted, openai_inputs


class OpenAIBody(BaseModel):
    """A part of an OpenAI API body: a value of the wrong type is refused, not coerced ("5"
    is not a number, "yes" not a boolean), and so is a field it does not have."""

    model_config = ConfigDict(extra="forbid", strict=True)


class RequestBody(OpenAIBody):
    """A whole request body: its unknown parameters refused by name, with the known one
    each may have meant (OpenAI's API refuses them too, where ignoring `max_token` would
    answer 16 sampled tokens and a 200)."""

    @model_validator(mode="before")
    @classmethod
    def _known_parameters(cls, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = [key for key in data if key not in cls.model_fields]
            if unknown:
                raise InvalidInputError("; ".join(cls._unknown(key) for key in unknown))
        return data

    @classmethod
    def _unknown(cls, key: str) -> str:
        meant = difflib.get_close_matches(key, cls.model_fields, n=1)
        hint = f"; did you mean {meant[0]}?" if meant else ""
        return f"{key}: not a parameter of this endpoint{hint}"


class FeatureBody(OpenAIBody):
    sae: str = Field(description="an SAE the model serves (GET /v1/model-info's saes)")
    feature_id: int


class InterventionBody(OpenAIBody):
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


class StreamOptions(OpenAIBody):
    include_usage: bool = False


class SamplingBody(RequestBody):
    """What OpenAI's completions and chat completions share (the parameters this server
    honours; `n`, the penalties and `logit_bias` only at their defaults)."""

    model: str | None = Field(None, description="the served model's name (GET /v1/models)")
    max_tokens: int | None = Field(None, description="at most this many (default 16)")
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's
    truncate_prompt_tokens: int | None = Field(
        None, description="keep only the prompt's last k tokens (its BOS kept)"
    )
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    return_token_ids: bool = False
    # attnserve's
    interventions: list[InterventionBody] = Field(default_factory=list)
    compare: bool = Field(
        False, description="each prompt's completion with and without the interventions"
    )

    def unsupported(self) -> dict[str, bool]:
        """Each parameter served only at its default, and whether it was changed."""
        return {
            "n": self.n != 1,
            "presence_penalty": self.presence_penalty != 0.0,
            "frequency_penalty": self.frequency_penalty != 0.0,
            "logit_bias": bool(self.logit_bias),
        }


class CompletionRequest(SamplingBody):
    """OpenAI's completion request (`echo`, `best_of` and `suffix` at their defaults only)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> dict[str, bool]:
        return super().unsupported() | {
            "echo": self.echo,
            "best_of": self.best_of not in (None, 1),
            "suffix": self.suffix is not None,
        }


class ContentPart(OpenAIBody):
    type: Literal["text"]  # this server's models read text only
    text: str


class ChatMessage(OpenAIBody):
    """One message of the conversation, as OpenAI's chat API takes it; the chat template
    reads every field (tool calls and results included)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None  # None only for an assistant's tool calls
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatRequest(SamplingBody):
    """OpenAI's chat completion request: the conversation rendered by the model's chat
    template."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = Field(
        None, description="the functions the template shows the model, as OpenAI's API lists them"
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="vLLM's: more variables for the chat template"
    )


def generate_options(body: SamplingBody, logprobs: int | None) -> GenerateOptions:
    """The data plane's options of a request's parameters (checked there, by name)."""
    for name, given in body.unsupported().items():
        if given:
            raise InvalidInputError(f"{name}: only its default is served")
    if body.compare and not body.interventions:
        raise InvalidInputError("compare: name interventions to compare the completion with")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    max_tokens = body.max_tokens
    if isinstance(body, ChatRequest) and body.max_completion_tokens is not None:
        max_tokens = body.max_completion_tokens
    return GenerateOptions(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=stop,
        stop_token_ids=tuple(body.stop_token_ids),
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
        interventions=tuple(
            _intervention(f"interventions[{i}]", e) for i, e in enumerate(body.interventions)
        ),
    )


def choices(
    body: SamplingBody, prompts: list[Input], logprobs: int | None
) -> list[tuple[Input, GenerateOptions]]:
    """Each choice's prompt and options: a choice per prompt, two with `compare` (the
    interventions' and the plain one, in that order)."""
    options = generate_options(body, logprobs)
    plain = replace(options, interventions=())
    chosen: list[tuple[Input, GenerateOptions]] = []
    for prompt in prompts:
        chosen.append((prompt, options))
        if body.compare:
            chosen.append((prompt, plain))
    return chosen


def completion_choices(
    body: CompletionRequest, tokenizer: Tokenizer, context: int
) -> list[tuple[Input, GenerateOptions]]:
    """Each prompt's choices; a prompt must leave the model's context (`context` tokens)
    room for one token."""
    prompts = openai_inputs("prompt", body.prompt)
    room = (context - 1, f"max_seq_len={context} less one position to generate in")
    ids = fitted("prompt", prompts, tokenizer, body.truncate_prompt_tokens, room)
    return choices(body, list(ids), body.logprobs)


def chat_choices(
    body: ChatRequest, chat: ChatTemplate | None, tokenizer: Tokenizer, model: str, context: int
) -> list[tuple[Input, GenerateOptions]]:
    """The conversation as its model's prompt (ids: the template writes the special tokens)."""
    if chat is None:
        raise InvalidInputError(
            f"model: {model} has no chat template (its checkpoint had none); use /v1/completions"
        )
    if not body.messages:
        raise InvalidInputError("messages: at least one message is required")
    messages = [_message(f"messages[{i}]", m) for i, m in enumerate(body.messages)]
    text = chat.render(messages, body.tools, body.chat_template_kwargs)
    room = (context - 1, f"max_seq_len={context} less one position to generate in")
    prompt = np.asarray(tokenizer.token_ids(text), dtype=np.int64)
    (ids,) = fitted("messages", [prompt], tokenizer, body.truncate_prompt_tokens, room)
    top = (body.top_logprobs or 0) if body.logprobs else None
    return choices(body, [ids], top)


def _message(field: str, message: ChatMessage) -> dict[str, Any]:
    """A message as chat templates read it (transformers passes OpenAI's fields through):
    only the fields given, a content of text parts joined into one text."""
    if message.content is None and not (message.role == "assistant" and message.tool_calls):
        raise InvalidInputError(
            f"{field}.content: required (only an assistant's message with tool_calls may "
            "leave it out)"
        )
    out = message.model_dump(exclude_none=True)
    if isinstance(message.content, list):
        out["content"] = "".join(part.text for part in message.content)
    return out


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
    """One choice's answer as its tokens come (OpenAI's text completion): the text, the
    finish reason, the ids and the log-probabilities."""

    def __init__(self, index: int, tokenizer: Tokenizer, logprobs: bool, token_ids: bool):
        self.index = index
        self.tokenizer = tokenizer
        self.logprobs, self.token_ids = logprobs, token_ids
        self.text = ""
        self.tokens: list[Token] = []

    def add(self, token: Token) -> dict:
        """Take one token; -> its stream chunk's choice (what it adds)."""
        self.text += token.text
        self.tokens.append(token)
        return self._choice(token.text, [token], len(self.text) - len(token.text), False)

    def choice(self) -> dict:
        """The whole choice (the answer without `stream`)."""
        return self._choice(self.text, self.tokens, 0, True)

    def _choice(self, text: str, tokens: list[Token], offset: int, whole: bool) -> dict:
        choice: dict = {
            "index": self.index,
            "text": text,
            "logprobs": self._logprobs(tokens, offset) if self.logprobs else None,
            "finish_reason": tokens[-1].finish_reason if tokens else None,
        }
        if self.token_ids:
            choice["token_ids"] = [t.token_id for t in tokens]
        return choice

    def _logprobs(self, tokens: list[Token], offset: int) -> dict:
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token.text)
        return {
            "tokens": [self.token_text(t.token_id) for t in tokens],
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [
                {self.token_text(i): lp for i, lp in t.top} if t.top else None for t in tokens
            ],
            "text_offset": offsets,
        }

    def token_text(self, token_id: int) -> str:
        """A token's text, or where it is part of a character its bytes ("<0xF0>"): the
        alternatives' keys stay apart."""
        text = self.tokenizer.decode([token_id])
        if not text or "\ufffd" in text:
            return self.tokenizer.token_strings([token_id])[0]
        return text


class ChatCompletion(Completion):
    """One choice of a chat completion: the assistant's message, or in a stream its delta
    (the role on the first)."""

    def _choice(self, text: str, tokens: list[Token], offset: int, whole: bool) -> dict:
        first = len(self.tokens) == 1  # a stream's first delta names the role
        message = {"role": "assistant", "content": text} if whole or first else {"content": text}
        choice: dict = {
            "index": self.index,
            "message" if whole else "delta": message,
            "logprobs": {"content": [self._entry(t) for t in tokens]} if self.logprobs else None,
            "finish_reason": tokens[-1].finish_reason if tokens else None,
        }
        if self.token_ids:
            choice["token_ids"] = [t.token_id for t in tokens]
        return choice

    def _entry(self, token: Token) -> dict:
        def item(token_id: int, logprob: float | None) -> dict:
            text = self.token_text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        top = [item(i, lp) for i, lp in token.top]
        return item(token.token_id, token.logprob) | {"top_logprobs": top}
