"""attnserve.v1's Generate through the Python client: the tokens OpenAI's completions answer,
one message per token, compare's two texts, refusals by field, and a caller that stops
reading ending the text on the server."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import numpy as np
import pytest

from attnserve.client import AsyncEncoderClient, ClientOptions, EncoderClient
from tests.conftest import SMALL_CONFIG
from tests.service.http.test_completions import _wait

PROMPT = "The cat sat on the mat."


def test_generate_streams_the_tokens_completions_answer(server, client):
    info = client.model_info()
    assert info["generates"] and not info["chat_template"]
    assert info["eos_id"] == SMALL_CONFIG.eos_id
    body = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "ignore_eos": True,
            "logprobs": 2, "return_token_ids": True}  # fmt: skip
    want = httpx.post(f"{server.http_url}/v1/completions", json=body, timeout=60).json()
    want = want["choices"][0]
    tokens = list(
        client.generate(PROMPT, max_tokens=10, temperature=0, ignore_eos=True, logprobs=2)
    )
    assert [t.token_id for t in tokens] == want["token_ids"]
    assert "".join(t.text for t in tokens) == want["text"]
    assert tokens[0].prompt_tokens == len(PROMPT.encode()) + 1
    assert all(t.prompt_tokens == 0 for t in tokens[1:])
    assert [t.finish_reason for t in tokens] == [None] * 9 + ["length"]
    got = np.array([t.logprob for t in tokens])
    assert np.abs(got - want["logprobs"]["token_logprobs"]).max() <= 1e-5  # float32 on the wire
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0][0] == t.token_id for t in tokens)


def test_compare_interleaves_the_steered_and_the_plain_text(client):
    steering = np.random.default_rng(1).normal(0, 4.0, SMALL_CONFIG.d_model)
    change = {"hook": "blocks.1.hook_resid_pre", "op": "add", "values": steering}
    options = dict(max_tokens=8, temperature=0, ignore_eos=True)
    both = list(client.generate(PROMPT, interventions=[change], compare=True, **options))
    steered = [t.token_id for t in both if t.choice == 0]
    plain = [t.token_id for t in both if t.choice == 1]

    def alone(**more) -> list[int]:
        return [t.token_id for t in client.generate(PROMPT, **options, **more)]

    assert plain == alone()
    assert steered == alone(interventions=[change])
    assert steered != plain


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"logprobs": 20}, "logprobs"),
        ({"compare": True}, "options.compare"),
        ({"interventions": [{"hook": "blocks.0.hook_resid_pre", "op": "clamp"}]}, "op"),
    ],
)
def test_bad_requests_are_invalid_argument_naming_the_field(client, options, field):
    with pytest.raises(grpc.RpcError) as caught:
        list(client.generate(PROMPT, **options))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in caught.value.details()


def test_a_caller_that_stops_reading_ends_the_text(server):
    plane = server.running.repository.get("")
    with EncoderClient(server.address, ClientOptions(timeout_s=60)) as c:
        for token in c.generate(PROMPT, max_tokens=250, ignore_eos=True):
            assert token.finish_reason is None
            break
    server.call(_wait(lambda: not plane.engine.generation.has_work and not plane._in_flight))


def test_the_async_client_iterates_the_same_tokens(server, client):
    options = dict(max_tokens=6, temperature=0, ignore_eos=True)

    async def tokens() -> list[int]:
        async with AsyncEncoderClient(server.address) as c:
            return [t.token_id async for t in c.generate(PROMPT, **options)]

    assert asyncio.run(tokens()) == [t.token_id for t in client.generate(PROMPT, **options)]
