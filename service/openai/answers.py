"""OpenAI's answers of a generation, built as its tokens come: each choice of a text
completion or a chat completion, whole or as a stream chunk's delta."""

from __future__ import annotations

from attnserve.model.tokenizer import Tokenizer
from attnserve.service.generate.output import Token


class Completion:
    """One choice's answer as its tokens come (OpenAI's text completion): the text, the
    finish reason, the ids and the log-probabilities."""

    def __init__(self, index: int, tokenizer: Tokenizer, logprobs: bool, token_ids: bool):
        self.index = index
        self.tokenizer = tokenizer
        self.logprobs, self.token_ids = logprobs, token_ids
        self.text = ""
        self.tokens: list[Token] = []

    def add(self, token: Token) -> dict:
        """Take one token; -> its stream chunk's choice (what it adds)."""
        self.text += token.text
        self.tokens.append(token)
        return self._choice(token.text, [token], len(self.text) - len(token.text), False)

    def choice(self) -> dict:
        """The whole choice (the answer without `stream`)."""
        return self._choice(self.text, self.tokens, 0, True)

    def _choice(self, text: str, tokens: list[Token], offset: int, whole: bool) -> dict:
        choice: dict = {
            "index": self.index,
            "text": text,
            "logprobs": self._logprobs(tokens, offset) if self.logprobs else None,
            "finish_reason": tokens[-1].finish_reason if tokens else None,
        }
        if self.token_ids:
            choice["token_ids"] = [t.token_id for t in tokens]
        return choice

    def _logprobs(self, tokens: list[Token], offset: int) -> dict:
        offsets = []
        for token in tokens:
            offsets.append(offset)
            offset += len(token.text)
        return {
            "tokens": [self.token_text(t.token_id) for t in tokens],
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [
                {self.token_text(i): lp for i, lp in t.top} if t.top else None for t in tokens
            ],
            "text_offset": offsets,
        }

    def token_text(self, token_id: int) -> str:
        """A token's text, or where it is part of a character its bytes ("<0xF0>"): the
        alternatives' keys stay apart."""
        text = self.tokenizer.decode([token_id])
        if not text or "\ufffd" in text:
            return self.tokenizer.token_strings([token_id])[0]
        return text


class ChatCompletion(Completion):
    """One choice of a chat completion: the assistant's message, or in a stream its delta
    (the role on the first)."""

    def _choice(self, text: str, tokens: list[Token], offset: int, whole: bool) -> dict:
        first = len(self.tokens) == 1  # a stream's first delta names the role
        message = {"role": "assistant", "content": text} if whole or first else {"content": text}
        choice: dict = {
            "index": self.index,
            "message" if whole else "delta": message,
            "logprobs": {"content": [self._entry(t) for t in tokens]} if self.logprobs else None,
            "finish_reason": tokens[-1].finish_reason if tokens else None,
        }
        if self.token_ids:
            choice["token_ids"] = [t.token_id for t in tokens]
        return choice

    def _entry(self, token: Token) -> dict:
        def item(token_id: int, logprob: float | None) -> dict:
            text = self.token_text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        top = [item(i, lp) for i, lp in token.top]
        return item(token.token_id, token.logprob) | {"top_logprobs": top}
