"""Chat templates rendered as transformers renders them: each template below, as a
checkpoint's tokenizer_config.json (or chat_template.jinja) carries it, through the import's
reader and the server's renderer, against transformers' own apply_chat_template on the same
directory, over conversations with system prompts, tool calls and results, reasoning,
non-ASCII text and the generation prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from attnserve.export.chat_template import read_chat_template
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.generate.chat import ChatTemplate

# Llama 3.1's shape: today's date, tools as JSON in the system turn, one tool call at most.
LLAMA3 = """{{- bos_token }}
{%- set date_string = strftime_now("%d %b %Y") %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none %}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", "parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}<|eot_id|>" }}
    {%- elif message.role == "tool" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {{- message.content | tojson }}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'
            + message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Loop controls, a namespace, dict(), the generation tag, reasoning, every special token.
EXTRAS = """{%- set ns = namespace(turns=0, last_user=none) %}
{%- set seen = dict(system=0) %}
{{- bos_token + unk_token + pad_token }}
{%- for m in messages %}
    {%- if m.role == 'system' %}{% continue %}{% endif %}
    {%- if ns.turns >= 6 %}{% break %}{% endif %}
    {%- set ns.turns = ns.turns + 1 %}
    {%- if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}
    {{- '<' + m.role + '>' }}
    {%- if m.role == 'assistant' %}
        {%- if m.thinking is defined %}{{ '[think]' + m.thinking + '[/think]' }}{% endif %}
        {%- generation %}{{ m.content }}{% endgeneration %}
    {%- else %}{{ m.content }}{% endif %}
    {{- eos_token }}
{%- endfor %}
{{- '|last user at ' + ns.last_user|string + '|' + seen|tojson(sort_keys=true) }}
{%- if add_generation_prompt %}{{ '<assistant>' }}{% endif %}
"""

# Every message as JSON: non-ASCII kept (transformers' tojson), separators given.
AS_JSON = """{{ messages | tojson(separators=(',', ':')) }}
{%- if tools %}{{ '\\ntools:' + tools | tojson }}{% endif %}
{%- if add_generation_prompt %}{{ '\\n>' }}{% endif %}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CONVERSATIONS = {
    "system and user": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Is it café weather? ☕"},
    ],
    "a tool call and its result": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": "Sunny, 21 °C", "tool_call_id": "call_1"},
        {"role": "user", "content": "Thanks."},
    ],
    "reasoning": [
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two and two."},
        {"role": "user", "content": "And 3 + 3?"},
    ],
}
TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}


def checkpoint(directory: Path, chat_template: str | list[dict]) -> Path:
    """A tokenizer's directory as the hub ships it: tokenizer.json (a small BPE trained
    here) and tokenizer_config.json with the template and the special tokens."""
    directory.mkdir()
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=list(TOKENS.values()))
    tokenizer.train_from_iterator(["The cat sat on the mat. Weather in Paris?"] * 10, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **TOKENS}
    (directory / "tokenizer_config.json").write_text(
        json.dumps({**config, "chat_template": chat_template})
    )
    return directory


def ours(directory: Path, tmp_path: Path) -> ChatTemplate:
    """The template as the import ships it and the server reads it."""
    shipped = read_chat_template(directory)
    assert shipped is not None
    path = tmp_path / "chat_template.json"
    path.write_text(json.dumps(shipped))
    return ChatTemplate(path)


def transformers_render(directory: Path, messages: list[dict], tools) -> str:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    return tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False
    )


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("template", ["llama3", "extras", "as_json"])
def test_templates_render_as_transformers_renders_them(tmp_path, template, conversation):
    source = {"llama3": LLAMA3, "extras": EXTRAS, "as_json": AS_JSON}[template]
    directory = checkpoint(tmp_path / "checkpoint", source)
    messages = CONVERSATIONS[conversation]
    chat = ours(directory, tmp_path)
    for tools in (None, TOOLS):
        want = transformers_render(directory, messages, tools)
        assert chat.render(messages, tools) == want


def test_a_tool_use_template_is_chosen_when_tools_are_given(tmp_path):
    named = [
        {"name": "default", "template": "plain:{{ messages[0].content }}"},
        {"name": "tool_use", "template": "tools:{{ tools | length }}:{{ messages[0].content }}"},
    ]
    directory = checkpoint(tmp_path / "checkpoint", named)
    messages = [{"role": "user", "content": "hi"}]
    chat = ours(directory, tmp_path)
    for tools in (None, TOOLS):
        assert chat.render(messages, tools) == transformers_render(directory, messages, tools)
    assert chat.render(messages, TOOLS) == "tools:1:hi"


def test_chat_template_jinja_and_named_files_are_read_as_transformers_reads_them(tmp_path):
    directory = checkpoint(tmp_path / "checkpoint", "ignored: the .jinja file wins")
    (directory / "chat_template.jinja").write_text("jinja:{{ messages[0].content }}")
    messages = [{"role": "user", "content": "hi"}]
    assert ours(directory, tmp_path).render(messages) == transformers_render(
        directory, messages, None
    )


def test_a_template_that_refuses_a_conversation_says_why(tmp_path):
    directory = checkpoint(tmp_path / "checkpoint", LLAMA3)
    two_calls = {"type": "function", "function": {"name": "weather", "arguments": {}}}
    messages = [{"role": "assistant", "tool_calls": [two_calls, two_calls]}]
    with pytest.raises(InvalidInputError, match=r"messages: .*single tool-calls"):
        ours(directory, tmp_path).render(messages)


def test_a_template_that_does_not_compile_costs_chat_alone(tmp_path):
    directory = checkpoint(tmp_path / "checkpoint", "{% for m in messages %}{{ m.content }}")
    chat = ours(directory, tmp_path)  # loads: the server starts
    with pytest.raises(InvalidInputError, match=r"model: its chat template 'default' does not"):
        chat.render([{"role": "user", "content": "hi"}])


def test_the_request_may_not_set_what_it_sets_itself(tmp_path):
    chat = ours(checkpoint(tmp_path / "checkpoint", AS_JSON), tmp_path)
    with pytest.raises(InvalidInputError, match=r"chat_template_kwargs\.add_generation_prompt"):
        chat.render([{"role": "user", "content": "hi"}], None, {"add_generation_prompt": False})
