"""POST /v1/completions on the small model: OpenAI's SDK unchanged, streaming, texts generated
together equal to each alone, sampling by seed, stop strings and ids, the interventions and
`compare`, clear refusals, and a client that goes away leaving the batch."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from openai import OpenAI

from tests.conftest import SMALL_CONFIG

MODEL = SMALL_CONFIG.name
PROMPTS = ["The cat sat on the mat.", "Attention", "A much longer prompt than the others are."]


@pytest.fixture(scope="module")
def openai_client(server):
    return OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)


def complete(server, **body) -> dict:
    answer = httpx.post(f"{server.http_url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def greedy(server, prompt, n=12, **extra) -> dict:
    body = dict(prompt=prompt, max_tokens=n, temperature=0, ignore_eos=True, **extra)
    return complete(server, return_token_ids=True, **body)["choices"][0]


def test_openai_sdk_streams_the_text_it_answers_whole(server, openai_client):
    whole = openai_client.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=10, temperature=0, logprobs=3,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    choice = whole.choices[0]
    assert choice.finish_reason == "length" and whole.usage.completion_tokens == 10
    assert whole.usage.prompt_tokens == len(PROMPTS[0].encode()) + 1  # the bytes and BOS
    assert len(choice.logprobs.token_logprobs) == 10
    logprobs = choice.logprobs
    for logprob, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert len(top) <= 3 and logprob <= 0
        assert max(top.values()) == pytest.approx(logprob)  # greedy: the most probable
    stream = openai_client.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == choice.text
    assert chunks[-1].usage.completion_tokens == 10
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_texts_generated_together_equal_each_alone(server):
    """Prompts of different lengths join a running batch at different steps (their caches
    padded in front): each gets the tokens it gets alone."""
    alone = [greedy(server, p, n=16, logprobs=0) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
        together = list(pool.map(lambda p: greedy(server, p, n=16, logprobs=0), PROMPTS * 2))
    for got, want in zip(together, alone * 2, strict=True):
        assert got["token_ids"] == want["token_ids"]
        lp, want_lp = (np.array(c["logprobs"]["token_logprobs"]) for c in (got, want))
        assert np.abs(lp - want_lp).max() <= 1e-4
    # one request with several prompts: a choice each, as each alone
    several = complete(
        server, prompt=PROMPTS, max_tokens=16, temperature=0, ignore_eos=True,
        return_token_ids=True,
    )  # fmt: skip
    assert [c["token_ids"] for c in several["choices"]] == [a["token_ids"] for a in alone]
    assert several["usage"]["completion_tokens"] == 16 * len(PROMPTS)


def test_a_seed_repeats_a_sampled_text_and_top_p_narrows_it(server):
    body = dict(prompt=PROMPTS[1], max_tokens=20, temperature=1.5, ignore_eos=True)
    first, again = (complete(server, seed=7, return_token_ids=True, **body) for _ in range(2))
    assert first["choices"][0]["token_ids"] == again["choices"][0]["token_ids"]
    other = complete(server, seed=8, return_token_ids=True, **body)
    assert other["choices"][0]["token_ids"] != first["choices"][0]["token_ids"]
    # a nucleus this small holds the most probable token only: greedy's text
    narrow = complete(server, seed=9, top_p=1e-6, return_token_ids=True, **body)
    assert narrow["choices"][0]["token_ids"] == greedy(server, PROMPTS[1], n=20)["token_ids"]


def test_stop_strings_and_ids_end_the_text(server):
    full = greedy(server, "hi", n=24)  # this random model's text: some of it ASCII
    ids, text = full["token_ids"], full["text"]
    start = next(i for i in range(4, len(text) - 2) if "\ufffd" not in text[i : i + 2])
    stop = text[start : start + 2]
    cut = greedy(server, "hi", n=24, stop=[stop])
    assert cut["finish_reason"] == "stop" and cut["text"] == text[: text.find(stop)]
    by_id = greedy(server, "hi", n=24, stop_token_ids=[ids[5]])
    assert by_id["finish_reason"] == "stop"
    assert by_id["token_ids"] == ids[: ids.index(ids[5]) + 1]  # the stop id is the last


def test_the_models_context_ends_a_text_that_would_pass_it(server):
    prompt = [5] * (SMALL_CONFIG.max_seq_len - 5)
    out = complete(server, prompt=prompt, max_tokens=50, temperature=0, ignore_eos=True)
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 6  # the last needs no position of its own


def test_interventions_steer_and_compare_answers_both(server):
    steering = np.random.default_rng(0).normal(0, 4.0, SMALL_CONFIG.d_model).tolist()
    change = {"hook": "blocks.0.hook_resid_post", "op": "add", "values": steering}
    plain = greedy(server, PROMPTS[0])
    both = complete(
        server, prompt=PROMPTS[0], max_tokens=12, temperature=0, ignore_eos=True,
        return_token_ids=True, interventions=[change], compare=True,
    )["choices"]  # fmt: skip
    assert both[1]["token_ids"] == plain["token_ids"]
    assert both[0]["token_ids"] != plain["token_ids"]
    assert both[0]["token_ids"] == greedy(server, PROMPTS[0], interventions=[change])["token_ids"]
    # a change at a prompt position only: the prompt's run differs, the text may follow
    at_start = {**change, "positions": [0], "scale": 0.0}
    assert greedy(server, PROMPTS[0], interventions=[at_start])["token_ids"] == plain["token_ids"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"logprobs": 11}, "logprobs"),
        ({"seed": -1}, "seed"),
        ({"n": 2}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": "x" * 400}, "prompt"),
        ({"prompt": [[1, 2], [SMALL_CONFIG.vocab_size]]}, "prompt.token_ids"),
        ({"interventions": [{"hook": "blocks.9.hook_resid_pre", "values": [1.0]}]}, "hook"),
        ({"compare": True}, "compare"),
    ],
)
def test_bad_requests_name_the_field_and_the_server_keeps_serving(server, body, field):
    answer = httpx.post(
        f"{server.http_url}/v1/completions", json={"prompt": "hi", **body}, timeout=60
    )
    assert answer.status_code == 400, answer.text
    assert field in answer.json()["error"]["message"]
    assert greedy(server, "hi", n=2)["finish_reason"] == "length"


def test_a_client_that_goes_away_leaves_the_batch(server):
    """A stream closed after its first tokens: its text leaves the running batch, and the
    tokens generated stop growing once it has."""
    plane = server.running.repository.get("")
    before = server.metric("attnserve_generated_tokens_total")
    body = {"prompt": PROMPTS[2], "max_tokens": 250, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.http_url}/v1/completions", json=body, timeout=60) as s:
        lines = s.iter_lines()
        assert next(lines).startswith("data: ")
    server.call(_wait(lambda: plane.generator.running == 0 and not plane._in_flight))
    generated = server.metric("attnserve_generated_tokens_total") - before
    assert 1 <= generated < 250  # it did not run to its end
    assert greedy(server, "hi", n=2)["finish_reason"] == "length"


async def _wait(condition, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def test_chat_completions_without_a_chat_template_are_refused_by_name(server):
    body = {"messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(f"{server.http_url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 501, answer.text
    assert "has no chat template" in answer.json()["error"]["message"]
