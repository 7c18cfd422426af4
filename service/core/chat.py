"""A conversation as the prompt its model was trained on: the checkpoint's chat template
(Jinja, shipped by the import as chat_template.json), rendered as transformers'
apply_chat_template renders it (a sandboxed environment, blocks trimmed, raise_exception),
then tokenized without special tokens added (the template writes them)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from attnserve.model.artifacts import ModelDirectory
from attnserve.service.core.errors import InvalidInputError


class ChatTemplate:
    def __init__(self, path: Path) -> None:
        data = json.loads(path.read_text())
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.globals["raise_exception"] = _raise
        self.template = environment.from_string(data["template"])
        self.tokens = {name: data.get(name, "") for name in ("bos_token", "eos_token")}

    def render(self, messages: Sequence[dict[str, str]]) -> str:
        """The conversation so far, ending where the assistant's reply begins."""
        try:
            return self.template.render(
                messages=list(messages), add_generation_prompt=True, **self.tokens
            )
        except TemplateError as exc:
            raise InvalidInputError(
                f"messages: the model's chat template refused them: {exc}"
            ) from None


def load_chat_template(directory: Path) -> ChatTemplate | None:
    """The model directory's chat template, or None where its checkpoint had none."""
    path = ModelDirectory(directory).chat_template_file
    return ChatTemplate(path) if path.is_file() else None


def _raise(message: str) -> None:
    raise TemplateError(message)
