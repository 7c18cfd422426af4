"""A checkpoint's chat template, shipped beside its model directory's tokenizer: what
`/v1/chat/completions` renders a conversation with (service/core/chat.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_chat_template(directory: Path) -> dict[str, str] | None:
    """The Jinja template transformers' apply_chat_template would use (chat_template.jinja,
    else tokenizer_config.json's chat_template: a string, or the one named "default" of a
    list) with the BOS and EOS strings it may print; None where the checkpoint has none."""
    config_path = directory / "tokenizer_config.json"
    config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.is_file() else {}
    template = config.get("chat_template")
    if (directory / "chat_template.jinja").is_file():
        template = (directory / "chat_template.jinja").read_text()
    if isinstance(template, list):
        named = {entry.get("name"): entry.get("template") for entry in template}
        template = named.get("default")
    if not isinstance(template, str) or not template.strip():
        return None
    return {
        "template": template,
        "bos_token": _token(config.get("bos_token")),
        "eos_token": _token(config.get("eos_token")),
    }


def _token(token: Any) -> str:
    """A special token given as a string or as {"content": ...}."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else ""
