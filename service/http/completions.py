"""OpenAI's completions API: POST /v1/completions, whole or streamed as server-sent events,
as its SDK calls it (attnserve's `interventions` and `compare` ride in its `extra_body`)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from attnserve.service.core.status import log_unexpected
from attnserve.service.http.completion_body import (
    Completion,
    CompletionRequest,
    completion_choices,
    completion_id,
)
from attnserve.service.http.errors import ErrorRoute, error_response
from attnserve.service.http.state import authorized, deadline, state

router = APIRouter(
    prefix="/v1", tags=["openai"], route_class=ErrorRoute, dependencies=[Depends(authorized)]
)


@router.post("/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> dict | StreamingResponse:
    """Each prompt continued (a choice each; two with `compare`: the interventions' first)."""
    s = state(request)
    with s.repository.observed("POST /v1/completions") as find:
        plane = find(body.model or "")
        choices = completion_choices(body)
        stack = contextlib.AsyncExitStack()
        lengths, tokens = await stack.enter_async_context(
            plane.generating(choices, deadline(request))
        )
        answers = [Completion(i, plane.tokenizer, body) for i in range(len(choices))]
        head = {
            "id": completion_id(),
            "object": "text_completion",
            "created": int(time.time()),
            "model": plane.name,
        }
        if body.stream:
            return StreamingResponse(
                _events(stack, tokens, answers, head, lengths, body), media_type="text/event-stream"
            )
        async with stack:
            async for index, token in tokens:
                answers[index].add(token)
                if await request.is_disconnected():
                    break
        usage = _usage(lengths, answers, body)
        return {**head, "choices": [a.choice() for a in answers], "usage": usage}


async def _events(
    stack: contextlib.AsyncExitStack,
    tokens: AsyncIterator,
    answers: list[Completion],
    head: dict,
    lengths: list[int],
    body: CompletionRequest,
) -> AsyncIterator[str]:
    """The stream: a chunk per token, the usage where asked, then [DONE]. A failure after
    the first byte is an event of OpenAI's error shape (the status has gone already)."""
    async with stack:
        try:
            async for index, token in tokens:
                yield _event({**head, "choices": [answers[index].add(token)]})
        except Exception as exc:
            log_unexpected("POST /v1/completions", exc)
            yield _event(json.loads(bytes(error_response("/v1/completions", exc).body)))
            return
    if body.stream_options and body.stream_options.include_usage:
        yield _event({**head, "choices": [], "usage": _usage(lengths, answers, body)})
    yield "data: [DONE]\n\n"


def _event(data: dict) -> str:
    return f"data: {json.dumps(data)}\n\n"


def _usage(lengths: list[int], answers: list[Completion], body: CompletionRequest) -> dict:
    prompts = sum(lengths[:: 2 if body.compare else 1])  # compare runs each prompt twice
    completed = sum(len(a.token_ids) for a in answers)
    return {
        "prompt_tokens": prompts,
        "completion_tokens": completed,
        "total_tokens": prompts + completed,
    }
