"""Tokenizers of each style real checkpoints ship, built here with `tokenizers` (no hub):
what decoding must get right, the first space of a SentencePiece text above all.

- byte_level: GPT-2's byte-level BPE (ByteLevel pre-tokenizer and decoder).
- metaspace: Metaspace pre-tokenizer and decoder (prepend "first"), as newer Llama and
  Mistral tokenizer.json files have.
- llama2: Llama 2's, TinyLlama's and Mistral 7B's: a normalizer that prepends and
  replaces spaces by "▁", no pre-tokenizer, byte fallback to <0xNN> pieces, and the
  decoders Replace, ByteFallback, Fuse, Strip (which drops a decode's first space).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

STYLES = ("byte_level", "metaspace", "llama2")
SPECIALS = ["<unk>", "<s>", "</s>"]
TEXTS = [
    "The capital of France is Paris. The cat sat on the mat.",
    "Le café est très bon, n'est-ce pas? Ça va très bien.",
    "Attention is all you need: queries, keys and values.",
    "Numbers 1 2 3 and 2026, tabs\tand  two spaces.",
]


def build(style: str) -> Tokenizer:
    if style == "byte_level":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer = trainers.BpeTrainer(
            vocab_size=500, special_tokens=SPECIALS, initial_alphabet=alphabet
        )
        tokenizer.train_from_iterator(TEXTS * 20, trainer)
        return tokenizer
    if style == "metaspace":
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tokenizer.decoder = decoders.Metaspace(prepend_scheme="first")
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS)
        tokenizer.train_from_iterator(TEXTS * 20, trainer)
        return tokenizer
    if style == "llama2":
        return _llama2()
    raise ValueError(style)


def _llama2() -> Tokenizer:
    """Trained with a Metaspace split (SentencePiece merges no pieces across spaces), then
    given Llama 2's normalizer, no pre-tokenizer, and the 256 byte pieces in its vocabulary
    for byte fallback."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS)
    tokenizer.train_from_iterator(TEXTS * 20, trainer)
    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    data["model"]["byte_fallback"] = True
    data["model"]["fuse_unk"] = True
    data["pre_tokenizer"] = None
    data["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ],
    }
    data["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    return Tokenizer.from_str(json.dumps(data))


def save(style: str, path: Path) -> Path:
    """The style's tokenizer.json at `path`."""
    build(style).save(str(path))
    return path
