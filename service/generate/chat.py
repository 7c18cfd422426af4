"""A conversation as the prompt its model was trained on: the checkpoint's chat templates
(Jinja, shipped by the import as chat_template.json), rendered as transformers 5's
apply_chat_template renders them, then tokenized without special tokens added (the
template writes them).

What transformers gives a template, given here alike (transformers/utils/
chat_template_utils.py): an immutable sandbox with blocks trimmed, `{% break %}` and
`{% continue %}` (jinja2's loopcontrols) and `{% generation %}` (its assistant tracker, here
rendering its body); `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII and
takes indent, separators and sort_keys, `dict`, and a `namespace` that refuses underscored
names; the messages with their None fields dropped and a message's reasoning under
`reasoning_content` and `thinking` too; `tools`, `documents`, `add_generation_prompt` and
the tokenizer's named special tokens. With tools, a template named "tool_use" is used where
the checkpoint has one, else "default".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from attnserve.model.artifacts import ModelDirectory
from attnserve.service.core.errors import InvalidInputError

log = logging.getLogger(__name__)

# What a request may not set through chat_template_kwargs: the request itself sets them.
RESERVED = ("messages", "tools", "documents", "add_generation_prompt")
# A message's reasoning, under each name templates read it by (transformers' order).
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplate:
    """A model's chat templates by name ("default", "tool_use", ...) and the special tokens
    they may print. A template that does not compile costs chat alone: rendering it is
    refused, saying why."""

    def __init__(self, path: Path) -> None:
        data = json.loads(path.read_text())
        sources: dict[str, str] = data.get("templates") or {"default": data["template"]}
        # directories exported before named templates held only BOS and EOS
        self.tokens: dict[str, str] = data.get("special_tokens") or {
            name: data[name] for name in ("bos_token", "eos_token") if data.get(name)
        }
        environment = _environment()
        self.templates: dict[str, jinja2.Template] = {}
        self.broken: dict[str, str] = {}  # name -> why it does not compile
        for name, source in sources.items():
            try:
                self.templates[name] = environment.from_string(source)
            except jinja2.TemplateSyntaxError as exc:
                self.broken[name] = f"line {exc.lineno}: {exc.message}"
                log.warning("%s: chat template %r does not compile (%s)", path, name, exc)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """The conversation so far, ending where the assistant's reply begins; `variables`
        are the template's own (vLLM's chat_template_kwargs: enable_thinking, ...)."""
        variables = dict(variables or {})
        for name in RESERVED:
            if name in variables:
                raise InvalidInputError(
                    f"chat_template_kwargs.{name}: set by the request itself, not here"
                )
        name = "tool_use" if tools is not None and self._has("tool_use") else "default"
        if name in self.broken:
            raise InvalidInputError(
                f"model: its chat template {name!r} does not compile ({self.broken[name]})"
            )
        if name not in self.templates:
            raise InvalidInputError(
                f"model: it has no chat template named 'default' (it has {sorted(self.templates)})"
            )
        try:
            return self.templates[name].render(
                messages=[_message(m) for m in messages],
                tools=None if tools is None else list(tools),
                documents=None,
                add_generation_prompt=True,
                **{**self.tokens, **variables},
            )
        except jinja2.TemplateError as exc:
            raise InvalidInputError(
                f"messages: the model's chat template refused them: {exc}"
            ) from None

    def _has(self, name: str) -> bool:
        return name in self.templates or name in self.broken


def load_chat_template(directory: Path) -> ChatTemplate | None:
    """The model directory's chat template, or None where its checkpoint had none."""
    path = ModelDirectory(directory).chat_template_file
    return ChatTemplate(path) if path.is_file() else None


def _message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as transformers hands it to the template: None fields dropped, and its
    reasoning, under any of its names, under `reasoning_content` and `thinking` too."""
    out = {key: value for key, value in message.items() if value is not None}
    reasoning = next((out[key] for key in REASONING_FIELDS if key in out), None)
    if reasoning is not None:
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return out


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["dict"] = _TemplateDict()
    environment.globals["namespace"] = _Namespace
    return environment


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: transformers marks the assistant's tokens
    with it (for training masks); rendering, it is its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares it so)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


class _TemplateDict:
    """`dict(...)` in a template: a dict, without the type's attributes to reach through."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """jinja2's namespace, refusing underscored names (no way to CPython's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # jinja2's signature: `self` may be a key
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot set underscored names on a namespace: {name!r}"
            )


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)
