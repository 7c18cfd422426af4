"""Torch-free tokenizers: how text becomes token ids, and ids become display strings.

"byte": UTF-8 bytes are the tokens (ids 0..255), a <bos> is prepended; no
vocabulary file. "hf": the model directory's tokenizer.json, run by the
Hugging Face `tokenizers` library exactly as transformers' fast tokenizers do.
"""

from __future__ import annotations

import codecs
from pathlib import Path

from attnserve.model.artifacts import ModelDirectory
from attnserve.model.config import ModelConfig

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

    def decode(self, ids: list[int]) -> str:
        """Text of the byte ids; special ids are dropped, broken UTF-8 is replaced."""
        return bytes(i for i in ids if i < 256 and i not in self._special).decode(
            "utf-8", errors="replace"
        )

    def token_ids(self, text: str) -> list[int]:
        """The ids of `text` alone, no special token added (a target token's text)."""
        return self.encode(text, add_bos=False)

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

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids)

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
