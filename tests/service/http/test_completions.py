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


def test_max_tokens_past_the_context_is_refused_and_the_default_fits_it(server):
    prompt = [5] * (SMALL_CONFIG.max_seq_len - 5)
    room = 6  # the last token needs no position of its own
    out = complete(server, prompt=prompt, max_tokens=room, temperature=0, ignore_eos=True)
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == room
    body = {"prompt": prompt, "max_tokens": room + 1, "ignore_eos": True}
    answer = httpx.post(f"{server.http_url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "max_tokens"
    assert f"more than the {room} tokens" in error["message"]
    assert f"max_seq_len={SMALL_CONFIG.max_seq_len}" in error["message"]
    # unset: OpenAI's 16, or the room where it is less
    out = complete(server, prompt=prompt, temperature=0, ignore_eos=True)
    assert out["usage"]["completion_tokens"] == room


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
    server.call(_wait(lambda: not plane.engine.generation.has_work and not plane._in_flight))
    generated = server.metric("attnserve_generated_tokens_total") - before
    assert 1 <= generated < 250  # it did not run to its end
    assert greedy(server, "hi", n=2)["finish_reason"] == "length"


async def _wait(condition, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def test_chat_completions_without_a_chat_template_are_refused_by_name(server):
    """400, not 501: OpenAI's SDK retries a 5xx three times, and the request is what is
    wrong for this model."""
    body = {"messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(f"{server.http_url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert "has no chat template" in error["message"] and error["param"] == "model"


LONG = "x" * (SMALL_CONFIG.max_seq_len + 10)


@pytest.mark.parametrize(
    ("path", "body", "param", "message"),
    [
        ("completions", {"max_token": 5}, "max_token", "did you mean max_tokens?"),
        ("completions", {"temprature": 0}, "temprature", "did you mean temperature?"),
        ("completions", {"max_tokens": "5"}, "max_tokens", "valid integer (got '5')"),
        ("completions", {"stream": "yes"}, "stream", "valid boolean (got 'yes')"),
        ("completions", {"max_tokens": 10**9}, "max_tokens", "is more than the"),
        ("completions", {"interventions": [{"hook": "blocks.9.hook_resid_pre", "values": [1]}]},
         "interventions[0].hook", "is not a hook site"),
        ("completions", {"interventions": [{"hook": "blocks.0.hook_resid_pre", "opp": "add"}]},
         "interventions[0].opp", "not a field here"),
        ("completions", {"prompt": LONG}, "prompt", "set truncate_prompt_tokens"),
        ("completions", {"truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "is not >= 1"),
        ("embeddings", {"input": ""}, "input", "the text is empty"),
        ("embeddings", {"input": ["a", ""]}, "input[1]", "the text is empty"),
        ("embeddings", {"input": "x", "dimension": 3}, "dimension", "did you mean dimensions?"),
        ("embeddings", {"input": ["a", LONG]}, "input[1]", "set truncate_prompt_tokens"),
        ("chat/completions", {"messages": [{"role": "robot", "content": "hi"}]},
         "messages[0].role", "Input should be"),
    ],
)  # fmt: skip
def test_openai_bodies_are_refused_by_the_field_as_sent(server, path, body, param, message):
    """As OpenAI's API refuses them: unknown parameters (not ignored), wrong types (not
    coerced), limits, each naming the field as the body named it, in `param` too."""
    if path == "completions":
        body = {"prompt": "The cat", **body}
    answer = httpx.post(f"{server.http_url}/v1/{path}", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and message in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_truncate_prompt_tokens_keeps_the_last_tokens_after_the_bos(server):
    """vLLM's truncate_prompt_tokens: a text cut to its last k tokens, its BOS kept, gives
    what those tokens give."""
    text = "The cat sat on the mat. " * 20
    keep = 12
    kept = [SMALL_CONFIG.bos_id, *text.encode()[-(keep - 1) :]]
    cut = complete(server, prompt=text, truncate_prompt_tokens=keep, max_tokens=4,
                   temperature=0, ignore_eos=True, return_token_ids=True)  # fmt: skip
    assert cut["usage"]["prompt_tokens"] == keep
    assert cut["choices"][0]["token_ids"] == greedy(server, kept, n=4)["token_ids"]
    body = {"input": [text], "truncate_prompt_tokens": keep}
    vectors = httpx.post(f"{server.http_url}/v1/embeddings", json=body, timeout=60).json()
    want = httpx.post(f"{server.http_url}/v1/embeddings", json={"input": [kept]}, timeout=60)
    np.testing.assert_allclose(
        vectors["data"][0]["embedding"], want.json()["data"][0]["embedding"], atol=1e-6
    )


def _with_chat(small_model_dir, directory, templates: dict[str, str]):
    """A server of the small model whose directory ships `templates` (byte tokens: the
    template's text is the prompt's bytes)."""
    import json

    from tests.conftest import ServerThread, linked_copy

    model = linked_copy(small_model_dir, directory)
    shipped = {"templates": templates, "special_tokens": {"eos_token": "</s>"}}
    (model / "chat_template.json").write_text(json.dumps(shipped))
    return ServerThread(model)


def test_chat_refusals_name_the_fields_as_the_chat_request_names_them(small_model_dir, tmp_path):
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"
    server = _with_chat(small_model_dir, tmp_path / "model", {"default": template})
    hi = [{"role": "user", "content": "hi"}]
    cases = [
        ({"messages": [{"role": "user"}]}, "messages[0].content", "required"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content", "required"),
        ({"messages": hi, "max_completion_tokens": 10**6}, "max_completion_tokens", "more than"),
        ({"messages": hi, "max_tokens": 10**6}, "max_tokens", "more than"),
        ({"messages": hi, "logprobs": True, "top_logprobs": 30}, "top_logprobs", "outside"),
        ({"messages": [{"role": "user", "content": "x" * 400}]}, "messages", "truncate_prompt"),
        ({"messages": hi, "chat_template_kwargs": {"messages": []}},
         "chat_template_kwargs.messages", "set by the request"),
    ]  # fmt: skip
    try:
        for body, param, message in cases:
            answer = httpx.post(f"{server.http_url}/v1/chat/completions", json=body, timeout=60)
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert error["param"] == param and message in error["message"], error
        body = {"messages": hi, "max_completion_tokens": 3, "temperature": 0}
        answer = httpx.post(f"{server.http_url}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200 and answer.json()["usage"]["prompt_tokens"] == len(
            "<user>hi<assistant>"
        )
    finally:
        server.stop()


def test_a_chat_template_that_does_not_compile_costs_chat_alone(small_model_dir, tmp_path):
    """A checkpoint whose template jinja2 cannot compile: the server starts and serves
    everything else; chat answers 400 saying why."""
    server = _with_chat(small_model_dir, tmp_path / "model", {"default": "{% if %}"})
    try:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        answer = httpx.post(f"{server.http_url}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["param"] == "model" and "does not compile (line 1" in error["message"]
        assert greedy(server, "The cat", n=2)["finish_reason"] == "length"
    finally:
        server.stop()
