"""A checkpoint's chat templates, shipped beside its model directory's tokenizer: what
`/v1/chat/completions` renders a conversation with (service/generate/chat.py).

Read as transformers 5 finds them: chat_template.jinja (the default) and
additional_chat_templates/NAME.jinja, else tokenizer_config.json's chat_template (a string,
or a list of named ones); and the named special tokens its apply_chat_template passes to
the template (`special_tokens_map`: bos, eos, unk, sep, pad, cls and mask tokens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def read_chat_template(directory: Path) -> dict[str, Any] | None:
    """{"templates": {name: Jinja source}, "special_tokens": {name: text}}, or None where
    the checkpoint has no chat template."""
    config = _json(directory / "tokenizer_config.json")
    given = config.get("chat_template")
    templates: dict[str, str] = {}
    if isinstance(given, str):
        templates["default"] = given
    elif isinstance(given, list):
        templates = {e["name"]: e["template"] for e in given if "name" in e and "template" in e}
    if (directory / "chat_template.jinja").is_file():
        templates["default"] = (directory / "chat_template.jinja").read_text()
    for path in sorted((directory / "additional_chat_templates").glob("*.jinja")):
        templates[path.stem] = path.read_text()
    templates = {name: t for name, t in templates.items() if isinstance(t, str) and t.strip()}
    if not templates:
        return None
    tokens = _json(directory / "special_tokens_map.json") | config  # the config's win
    special = {name: _token(tokens.get(name)) for name in SPECIAL_TOKENS}
    return {"templates": templates, "special_tokens": {k: v for k, v in special.items() if v}}


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token(token: Any) -> str:
    """A special token given as a string or as {"content": ...}."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else ""
