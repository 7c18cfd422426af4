"""Texts that leave never break the others: many streams at once over gRPC and HTTP, half
of them cancelled at random points while new prompts join, and every other text equals its
run alone, token for token and character for character (the real server and ONNX Runtime:
the running batch's rows, caches and masks are the subject)."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import pytest

from attnserve.client import AsyncEncoderClient, ClientOptions
from tests.service.http.test_completions import _wait

STREAMS, ROUNDS, MAX_TOKENS = 40, 3, 40
PROMPTS = ["The cat" + " sat" * k for k in range(STREAMS)]
OPTIONS = {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def alone(server) -> list[tuple[list[int], str]]:
    """Each prompt's tokens and text, generated with nothing else running."""

    async def each() -> list[tuple[list[int], str]]:
        async with AsyncEncoderClient(server.address, ClientOptions(timeout_s=120)) as c:
            out = []
            for prompt in PROMPTS:
                tokens = [t async for t in c.generate(prompt, **OPTIONS)]
                out.append(([t.token_id for t in tokens], "".join(t.text for t in tokens)))
            return out

    return asyncio.run(each())


async def _grpc_tokens(
    client: AsyncEncoderClient, prompt: str, cut: int | None, running: asyncio.Event
) -> list[int]:
    """The token ids of a gRPC stream (`running` set at the first), the call cancelled after
    `cut` of them."""
    got: list[int] = []
    async for token in client.generate(prompt, **OPTIONS):
        got.append(token.token_id)
        running.set()
        if len(got) == cut:
            break  # leaving the loop cancels the call
    return got


async def _http_text(
    http: httpx.AsyncClient, prompt: str, cut: int | None, running: asyncio.Event
) -> str:
    """The text of an HTTP stream of server-sent events (`running` set at the first chunk),
    the connection closed after `cut` chunks; the stream must end with [DONE] otherwise."""
    body = {"prompt": prompt, "stream": True, **OPTIONS}
    text, chunks = "", 0
    async with http.stream("POST", "/v1/completions", json=body) as answer:
        assert answer.status_code == 200
        async for line in answer.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return text
            event = json.loads(line[len("data: ") :])
            assert "error" not in event, event
            text += event["choices"][0]["text"]
            chunks += 1
            running.set()
            if chunks == cut:
                return text  # leaving the block closes the connection
    raise AssertionError("the stream ended without [DONE]")


def test_streams_cancelled_at_random_leave_every_other_text_as_it_is_alone(server, alone):
    plane = server.running.repository.get("")

    async def round_of(seed: int) -> list[tuple[int, object]]:
        rng = random.Random(seed)
        cancelled = set(rng.sample(range(STREAMS), STREAMS // 2))
        cuts = {i: rng.randint(1, 12) if i in cancelled else None for i in range(STREAMS)}
        running = [asyncio.Event() for _ in range(STREAMS)]
        async with (
            AsyncEncoderClient(server.address, ClientOptions(timeout_s=120)) as grpc_client,
            httpx.AsyncClient(base_url=server.http_url, timeout=120) as http,
        ):

            async def stream(i: int) -> tuple[int, object]:
                if i:  # each joins once the one before it runs: joins meet leaves
                    await running[i - 1].wait()
                if i % 2 == 0:
                    return i, await _grpc_tokens(grpc_client, PROMPTS[i], cuts[i], running[i])
                return i, await _http_text(http, PROMPTS[i], cuts[i], running[i])

            return await asyncio.gather(*(stream(i) for i in range(STREAMS)))

    for seed in range(ROUNDS):
        cancelled = set(random.Random(seed).sample(range(STREAMS), STREAMS // 2))
        results = asyncio.run(round_of(seed))
        for i, got in results:
            ids, text = alone[i]
            if i in cancelled:
                want = ids[: len(got)] if i % 2 == 0 else text[: len(got)]  # type: ignore[arg-type]
            else:
                want = ids if i % 2 == 0 else text
            assert got == want, (seed, i)
    server.call(_wait(lambda: not plane.engine.generation.has_work and not plane._in_flight))
