"""Torch-free byte-level tokenizer: UTF-8 bytes are the tokens.

Ids 0..255 are the bytes themselves; the special ids (pad, bos, eos) come from
the model config. Any text encodes losslessly and no vocabulary file is needed.
"""

from __future__ import annotations

from model.config import ModelConfig


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
                labels.append("\u2423")  # a visible space: "␣"
            elif 32 < i < 127:
                labels.append(chr(i))
            else:
                labels.append(f"<0x{i:02X}>")
        return labels


def get_tokenizer(config: ModelConfig) -> ByteTokenizer:
    """The tokenizer the config names."""
    if config.tokenizer == "byte":
        return ByteTokenizer(config)
    raise ValueError(f"no tokenizer for kind {config.tokenizer!r}")
