"""OpenAI's completions APIs: POST /v1/completions and /v1/chat/completions (where the model
has a chat template), whole or streamed as server-sent events, as its SDK calls them
(attnserve's `interventions` and `compare` ride in its `extra_body`)."""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from attnserve.service.core.dataplane import DataPlane
from attnserve.service.core.errors import fields_named
from attnserve.service.core.request import GenerateOptions, Input
from attnserve.service.core.status import log_unexpected
from attnserve.service.generate.output import Token
from attnserve.service.http.errors import ErrorRoute, error_response
from attnserve.service.http.state import authorized, deadline, state
from attnserve.service.openai.answers import ChatCompletion, Completion
from attnserve.service.openai.protocol import ChatRequest, CompletionRequest, SamplingBody
from attnserve.service.openai.translate import chat_choices, completion_choices

# The plan's names of what these bodies name otherwise.
OPENAI_NAMES = {"options.interventions": "interventions"}

router = APIRouter(
    prefix="/v1", tags=["openai"], route_class=ErrorRoute, dependencies=[Depends(authorized)]
)


@router.post("/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> dict | StreamingResponse:
    """Each prompt continued (a choice each; two with `compare`: the interventions' first)."""
    with (
        state(request).repository.observed("POST /v1/completions") as find,
        fields_named(OPENAI_NAMES),
    ):
        plane = find(body.model or "")
        chosen = completion_choices(body, plane.tokenizer, plane.view.config.max_seq_len)
        answers = [
            Completion(i, plane.tokenizer, body.logprobs is not None, body.return_token_ids)
            for i in range(len(chosen))
        ]
        return await _answer(request, plane, body, chosen, answers, "text_completion")


@router.post("/chat/completions", response_model=None)
async def chat_completions(body: ChatRequest, request: Request) -> dict | StreamingResponse:
    """The assistant's reply to the conversation (two with `compare`)."""
    # chat names the plan's logprobs top_logprobs, and its prompt the messages
    names = OPENAI_NAMES | {"logprobs": "top_logprobs", "prompt": "messages"}
    if body.max_completion_tokens is not None:
        names["max_tokens"] = "max_completion_tokens"
    with (
        state(request).repository.observed("POST /v1/chat/completions") as find,
        fields_named(names),
    ):
        plane = find(body.model or "")
        context = plane.view.config.max_seq_len
        chosen = chat_choices(body, plane.chat, plane.tokenizer, plane.name, context)
        answers: list[Completion] = [
            ChatCompletion(i, plane.tokenizer, body.logprobs, body.return_token_ids)
            for i in range(len(chosen))
        ]
        return await _answer(request, plane, body, chosen, answers, "chat.completion")


async def _answer(
    request: Request,
    plane: DataPlane,
    body: SamplingBody,
    chosen: list[tuple[Input, GenerateOptions]],
    answers: list[Completion],
    kind: str,
) -> dict | StreamingResponse:
    """Admit and start the generation; answer it whole, or as a stream of chunks."""
    stack = contextlib.AsyncExitStack()
    lengths, tokens = await stack.enter_async_context(plane.generating(chosen, deadline(request)))
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    head: dict = {"id": f"{prefix}-{secrets.token_hex(12)}", "object": kind}
    head |= {"created": int(time.time()), "model": plane.name}
    if body.stream:
        chunks = head | {"object": f"{kind}.chunk" if kind == "chat.completion" else kind}
        events = _events(stack, tokens, answers, chunks, lengths, body, request.url.path)
        return StreamingResponse(events, media_type="text/event-stream")
    async with stack:
        async for index, token in tokens:
            answers[index].add(token)
            if await request.is_disconnected():
                break
    usage = _usage(lengths, answers, body)
    return {**head, "choices": [a.choice() for a in answers], "usage": usage}


async def _events(
    stack: contextlib.AsyncExitStack,
    tokens: AsyncIterator[tuple[int, Token]],
    answers: list[Completion],
    head: dict,
    lengths: list[int],
    body: SamplingBody,
    path: str,
) -> AsyncIterator[str]:
    """The stream: a chunk per token, the usage where asked, then [DONE]. A failure after
    the first byte is an event of OpenAI's error shape (the status has gone already)."""
    async with stack:
        try:
            async for index, token in tokens:
                yield _event({**head, "choices": [answers[index].add(token)]})
        except Exception as exc:
            log_unexpected(f"POST {path}", exc)
            yield _event(json.loads(bytes(error_response(path, exc).body)))
            return
    if body.stream_options and body.stream_options.include_usage:
        yield _event({**head, "choices": [], "usage": _usage(lengths, answers, body)})
    yield "data: [DONE]\n\n"


def _event(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


def _usage(lengths: list[int], answers: list[Completion], body: SamplingBody) -> dict:
    prompts = sum(lengths[:: 2 if body.compare else 1])  # compare runs each prompt twice
    completed = sum(len(a.tokens) for a in answers)
    return {
        "prompt_tokens": prompts,
        "completion_tokens": completed,
        "total_tokens": prompts + completed,
    }
