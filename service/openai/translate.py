"""OpenAI's requests as the core's: each choice's prompt and GenerateOptions, the
interventions, the embeddings' inputs (errors name the body's fields)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from attnserve.model.tokenizer import Tokenizer
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.request import GenerateOptions, Input, Intervention
from attnserve.service.generate.chat import ChatTemplate
from attnserve.service.openai.inputs import fitted, openai_inputs
from attnserve.service.openai.protocol import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    EmbeddingsRequest,
    InterventionBody,
    SamplingBody,
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


def embedding_inputs(body: EmbeddingsRequest, d_model: int) -> list[Input]:
    if body.dimensions is not None and body.dimensions != d_model:
        raise InvalidInputError(
            f"dimensions: this model's embeddings have {d_model} dimensions, "
            f"{body.dimensions} were asked for"
        )
    return openai_inputs("input", body.input, empty_text=False)
