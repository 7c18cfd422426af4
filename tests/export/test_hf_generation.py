"""Generation on every family the importer takes, served, against transformers' `generate`:
the same greedy tokens, plain and with a steering vector added at one layer's residual
stream on both sides (at the prompt's positions and every generated one); chat templates."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch

from tests.conftest import ServerThread
from tests.export.families import FAMILY_SHAPES

FAMILIES = sorted(FAMILY_SHAPES)  # sliding windows, soft-caps, GQA, rope scalings, ...
NEW_TOKENS = 32
PROMPT = [1, 5, 17, 33, 8, 90, 12]  # longer than gemma2's window once generation runs


def transformers_greedy(reference, steering: np.ndarray | None, layer: int) -> list[int]:
    """transformers' greedy continuation, with `steering` added to what decoder layer
    `layer` reads (TransformerLens' blocks.{layer}.hook_resid_pre) where given."""
    handles = []
    if steering is not None:
        vector = torch.from_numpy(steering)

        def add(_module, args, kwargs):
            if args:
                return (args[0] + vector, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + vector}

        block = decoder_layers(reference.base_model)[layer]
        handles.append(block.register_forward_pre_hook(add, with_kwargs=True))
    try:
        with torch.no_grad():
            out = reference.generate(
                torch.tensor([PROMPT]),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
            )
    finally:
        for handle in handles:
            handle.remove()
    return out[0, len(PROMPT) :].tolist()


def decoder_layers(base: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers of a transformers base model: .layers, GPT-2's and GPT-J's .h,
    OPT's .decoder.layers."""
    for path in ("layers", "h", "decoder.layers"):
        found = base.get_submodule(path) if hasattr(base, path.split(".")[0]) else None
        if isinstance(found, torch.nn.ModuleList):
            return found
    raise AttributeError(f"{type(base).__name__} has no decoder layers")


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_transformers_plain_and_steered(families, family):
    _, reference = families.checkpoint(family)
    width = reference.config.hidden_size
    steering = np.random.default_rng(0).normal(0, 2.0, width).astype(np.float32)
    layer = 1
    plain = transformers_greedy(reference, None, layer)
    steered = transformers_greedy(reference, steering, layer)
    assert steered != plain  # the vector changes the text: the comparison below can fail
    server = ServerThread(families.exported(family))
    try:
        body = {
            "prompt": PROMPT,
            "max_tokens": NEW_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
            "interventions": [
                {"hook": f"blocks.{layer}.hook_resid_pre", "op": "add", "values": steering.tolist()}
            ],
            "compare": True,
        }
        answer = httpx.post(f"{server.http_url}/v1/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        choices = answer.json()["choices"]
        assert [c["index"] for c in choices] == [0, 1]
        assert choices[0]["token_ids"] == steered
        assert choices[1]["token_ids"] == plain
        assert all(c["finish_reason"] == "length" for c in choices)
    finally:
        server.stop()


# Zephyr's template (TinyLlama-Chat's), as its tokenizer_config.json carries it.
ZEPHYR = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\\n'  + "
    "message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and "
    "add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"
)


def test_chat_completions_render_the_checkpoints_template_as_transformers(tmp_path):
    """A checkpoint with a chat template: its import ships it, /v1/chat/completions
    renders a conversation into the ids transformers' apply_chat_template makes and answers
    transformers' greedy reply, whole and streamed by OpenAI's SDK."""
    from openai import OpenAI
    from transformers import AutoTokenizer

    from perf.hf_checkpoints import build_checkpoint
    from tests.conftest import run_cli

    source = tmp_path / "llama"
    reference = build_checkpoint("llama", source, **FAMILY_SHAPES["llama"])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
              "eos_token": "</s>", "chat_template": ZEPHYR}  # fmt: skip
    (source / "tokenizer_config.json").write_text(json.dumps(config))
    out = tmp_path / "model"
    result = run_cli("export", "--from-hf", str(source), "--out", str(out))
    assert result.returncode == 0, result.stderr
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "The cat sat on the mat."},
    ]
    ids = AutoTokenizer.from_pretrained(source).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    with torch.no_grad():
        want = reference.generate(
            torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12, do_sample=False
        )[0, len(ids) :].tolist()
    server = ServerThread(out)
    try:
        sdk = OpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0)
        options = dict(model="llama", messages=messages, max_tokens=12, temperature=0)
        extra = {"ignore_eos": True, "return_token_ids": True}
        whole = sdk.chat.completions.create(**options, extra_body=extra)
        assert whole.usage.prompt_tokens == len(ids)
        assert whole.choices[0].model_extra["token_ids"] == want
        assert whole.choices[0].message.role == "assistant"
        chunks = list(sdk.chat.completions.create(**options, stream=True, extra_body=extra))
        assert chunks[0].choices[0].delta.role == "assistant"
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert streamed == whole.choices[0].message.content
    finally:
        server.stop()


def test_a_sentencepiece_checkpoint_continues_its_prompt_as_its_tokenizer_writes_it(tmp_path):
    """Llama 2's tokenizer (byte fallback, a decoder that strips a decode's first space):
    the served continuation, whole and streamed, is decode(prompt + generated) less
    decode(prompt), so "... is" continues " Paris", not "Paris". The prompt is one whose
    first greedy token begins with "▁", the case that decoding it alone gets wrong."""
    from tokenizers import Tokenizer

    from perf.hf_checkpoints import build_checkpoint
    from tests.conftest import run_cli
    from tests.tokenizer_styles import TEXTS, save

    source = tmp_path / "llama"
    tokenizer_file = save("llama2", tmp_path / "tokenizer.json")
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    shape = {**FAMILY_SHAPES["llama"], "vocab_size": tokenizer.get_vocab_size()}
    reference = build_checkpoint("llama", source, **shape)
    (source / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    words = " ".join(TEXTS).split()
    prompts = [" ".join(words[:k]) for k in range(1, len(words))]
    with torch.no_grad():
        first = [
            int(reference(torch.tensor([tokenizer.encode(p).ids])).logits[0, -1].argmax())
            for p in prompts
        ]
    prompt = next(
        p for p, t in zip(prompts, first, strict=True) if tokenizer.id_to_token(t)[0] == "▁"
    )
    out = tmp_path / "model"
    result = run_cli("export", "--from-hf", str(source), "--out", str(out))
    assert result.returncode == 0, result.stderr
    server = ServerThread(out)
    try:
        body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        url = f"{server.http_url}/v1/completions"
        whole = httpx.post(url, json=body | {"return_token_ids": True}, timeout=120).json()
        choice = whole["choices"][0]
        prompt_ids = tokenizer.encode(prompt).ids
        want = tokenizer.decode(prompt_ids + choice["token_ids"])[
            len(tokenizer.decode(prompt_ids)) :
        ]
        assert want.startswith(" ") and choice["text"] == want
        with httpx.stream("POST", url, json=body | {"stream": True}, timeout=120) as answer:
            events = [line[6:] for line in answer.iter_lines() if line.startswith("data: {")]
        assert "".join(json.loads(e)["choices"][0]["text"] for e in events) == want
    finally:
        server.stop()
