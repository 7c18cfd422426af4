"""Torch-free tokenizers: how text becomes token ids, and ids become display strings.

"byte": UTF-8 bytes are the tokens (ids 0..255), a <bos> is prepended; no
vocabulary file. "hf": the model directory's tokenizer.json, run by the
Hugging Face `tokenizers` library exactly as transformers' fast tokenizers do.

A text being generated is decoded by a stream primed with its prompt (`stream`): each
token's characters as `decode(prompt + generated)` less `decode(prompt)` has them, in
constant work per token. Decoding the generated ids alone would lose what a decoder does
at a text's start: SentencePiece's decoders drop the first space ("isParis").
"""

from __future__ import annotations

import codecs
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from attnserve.model.artifacts import ModelDirectory
from attnserve.model.config import ModelConfig

if TYPE_CHECKING:  # imported where a tokenizer.json is read: the byte tokenizer needs none
    import tokenizers

VISIBLE_SPACE = "\u2423"  # "␣": spaces shown in token labels


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's (GPT-2's) character for each byte, inverted: printable bytes stand
    for themselves, the others for 256 + their rank among them."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    chars = [*map(chr, printable), *(chr(256 + n) for n in range(len(others)))]
    return dict(zip(chars, printable + others, strict=True))


_BYTE_OF = _byte_level_alphabet()
# Bytes that are not a whole UTF-8 character are shown as the byte tokenizer shows them.
_BYTES_SHOWN = "attnserve-bytes"
codecs.register_error(
    _BYTES_SHOWN,
    lambda e: ("".join(f"<0x{b:02X}>" for b in e.object[e.start : e.end]), e.end),  # type: ignore[attr-defined]
)


class ByteTokenizer:
    kind = "byte"

    def __init__(self, config: ModelConfig) -> None:
        self.pad_id = config.pad_id
        self.bos_id = config.bos_id
        self.eos_id = config.eos_id
        self.vocab_size = config.vocab_size
        self._special = {config.pad_id: "<pad>", config.bos_id: "<bos>", config.eos_id: "<eos>"}

    def encode(self, text: str, add_bos: bool = True, add_eos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        if add_bos:
            ids.insert(0, self.bos_id)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: list[int], special: bool = False) -> str:
        """Text of the byte ids; special ids are dropped (`special`: written by name),
        broken UTF-8 is replaced."""
        if special:  # each run of bytes decoded, the special ids between them named
            runs = itertools.groupby(ids, key=lambda i: i in self._special)
            return "".join(
                "".join(self._special[i] for i in run) if named else self.decode(list(run))
                for named, run in runs
            )
        return bytes(i for i in ids if i < 256 and i not in self._special).decode(
            "utf-8", errors="replace"
        )

    def token_ids(self, text: str) -> list[int]:
        """The ids of `text` alone, no special token added (a target token's text)."""
        return self.encode(text, add_bos=False)

    def stream(self, prompt: Sequence[int]) -> ByteStream:
        """A decoder of the tokens that follow `prompt`."""
        return ByteStream(self, prompt)

    def token_strings(self, ids: list[int]) -> list[str]:
        """One printable label per id (for heatmap axes): specials by name, bytes as text."""
        labels = []
        for i in ids:
            if i in self._special:
                labels.append(self._special[i])
            elif i == 32:
                labels.append(VISIBLE_SPACE)
            elif 32 < i < 127:
                labels.append(chr(i))
            else:
                labels.append(f"<0x{i:02X}>")
        return labels


class HFTokenizer:
    """A tokenizer.json (e.g. GPT-2's byte-level BPE) through the `tokenizers` library."""

    kind = "hf"

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer, decoders  # only needed for "hf" models

        self.path = path
        self._tokenizer = Tokenizer.from_file(str(path))
        # byte-level BPE (GPT-2's): every piece's characters stand for bytes
        self._byte_level = isinstance(self._tokenizer.decoder, decoders.ByteLevel)

    def encode(self, text: str) -> list[int]:
        # As GPT2TokenizerFast: the file's own post-processor decides on special tokens.
        return self._tokenizer.encode(text).ids

    def token_ids(self, text: str) -> list[int]:
        """The ids of `text` alone, no special token added (a target token's text)."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], special: bool = False) -> str:
        """The text of `ids`; special tokens are dropped (`special`: written out)."""
        return self._tokenizer.decode(ids, skip_special_tokens=not special)

    def stream(self, prompt: Sequence[int]) -> HFStream:
        """A decoder of the tokens that follow `prompt`."""
        return HFStream(self._tokenizer, prompt)

    def token_strings(self, ids: list[int]) -> list[str]:
        """Each token's own text (byte-level pieces decoded), spaces made visible; a piece
        that is part of a character (an emoji's four bytes, each its own token) shows its
        bytes as the byte tokenizer does ("<0xF0>"), not as a replacement character."""
        return [self._token_string(i).replace(" ", VISIBLE_SPACE) for i in ids]

    def _token_string(self, token_id: int) -> str:
        text = self._tokenizer.decode([token_id], skip_special_tokens=False)
        piece = self._tokenizer.id_to_token(token_id) or f"<{token_id}>"
        if "\ufffd" not in text:
            return text or piece
        if self._byte_level and set(piece) <= _BYTE_OF.keys():
            return bytes(_BYTE_OF[c] for c in piece).decode("utf-8", errors=_BYTES_SHOWN)
        return piece  # e.g. a byte-fallback piece, "<0xF0>" already


class ByteStream:
    """The byte tokenizer's text as tokens come: UTF-8 decoded incrementally (a character
    spelled over several tokens comes with its last byte), special ids writing nothing."""

    def __init__(self, tokenizer: ByteTokenizer, prompt: Sequence[int]) -> None:
        self._special = set(tokenizer._special)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._utf8.decode(self._bytes(prompt))  # a character the prompt began goes on

    def step(self, token_id: int) -> str:
        """The characters this token completes ("" while one is being spelled)."""
        return self._utf8.decode(self._bytes([token_id]))

    def rest(self) -> str:
        """At the text's end: a character left half-spelled, as decode writes it."""
        return self._utf8.decode(b"", final=True)

    def _bytes(self, ids: Sequence[int]) -> bytes:
        return bytes(i for i in ids if i < 256 and i not in self._special)


# Tokens of context a decoder needs to write the next one as a whole text would (vLLM's
# incremental detokenizer starts from 5).
CONTEXT = 5


class HFStream:
    """A tokenizer.json's text as tokens come: `tokenizers`' DecodeStream primed with the
    prompt (its decoders see each token in its context, in a window of a few tokens)."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, prompt: Sequence[int]) -> None:
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer
        self._stream = DecodeStream(ids=[int(i) for i in prompt], skip_special_tokens=True)
        self._held: list[int] = []  # tokens whose characters are not complete yet
        self._context = [int(i) for i in prompt[-CONTEXT:]]  # the tokens before them

    def step(self, token_id: int) -> str:
        """The characters this token completes ("" while one is being spelled)."""
        text = self._stream.step(self._tokenizer, int(token_id))
        if text is None:
            self._held.append(int(token_id))
            return ""
        self._context = [*self._context, *self._held, int(token_id)][-CONTEXT:]
        self._held.clear()
        return text

    def rest(self) -> str:
        """At the text's end: what the tokens still held write, as decode writes them in
        their context (a character left half-spelled as U+FFFD). Byte fallback's decoder
        replaces every byte of a run that ends mid-character, characters completed before
        it in the run included: those went out already, and the one left is one U+FFFD."""
        if not self._held:
            return ""
        before = self._tokenizer.decode(self._context, skip_special_tokens=True)
        after = self._tokenizer.decode(self._context + self._held, skip_special_tokens=True)
        self._held.clear()
        return after[len(before) :] if after.startswith(before) else "\ufffd"


Tokenizer = ByteTokenizer | HFTokenizer


def get_tokenizer(
    config: ModelConfig, model_dir: ModelDirectory | str | Path | None = None
) -> Tokenizer:
    """The tokenizer the config names; "hf" reads the directory's tokenizer.json."""
    if config.tokenizer == "byte":
        return ByteTokenizer(config)
    if model_dir is None:
        raise ValueError(f"tokenizer {config.tokenizer!r} needs the model directory")
    if not isinstance(model_dir, ModelDirectory):
        model_dir = ModelDirectory(model_dir)
    path = model_dir.tokenizer_file
    if not path.is_file():
        raise FileNotFoundError(f"the model config names tokenizer 'hf' but {path} is missing")
    return HFTokenizer(path)
