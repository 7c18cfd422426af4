"""Torch-free tokenizers: how text becomes token ids, and ids become display strings.

"byte": UTF-8 bytes are the tokens (ids 0..255), a <bos> is prepended; no
vocabulary file. "hf": the model directory's tokenizer.json, run by the
Hugging Face `tokenizers` library exactly as transformers' fast tokenizers do.
"""

from __future__ import annotations

from pathlib import Path

from attnserve.model.artifacts import ModelDirectory
from attnserve.model.config import ModelConfig

VISIBLE_SPACE = "\u2423"  # "␣": spaces shown in token labels


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
        from tokenizers import Tokenizer  # only needed for "hf" models

        self.path = path
        self._tokenizer = Tokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        # As GPT2TokenizerFast: the file's own post-processor decides on special tokens.
        return self._tokenizer.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids)

    def token_strings(self, ids: list[int]) -> list[str]:
        """Each token's own text (byte-level pieces decoded), spaces made visible."""
        return [
            self._tokenizer.decode([i], skip_special_tokens=False).replace(" ", VISIBLE_SPACE)
            or (self._tokenizer.id_to_token(i) or f"<{i}>")
            for i in ids
        ]


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
