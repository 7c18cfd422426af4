import pytest

from attnserve.model.config import ModelConfig
from attnserve.model.tokenizer import ByteTokenizer, get_tokenizer

TEXTS = ["hello", "café crème", "emoji 🤖 ok", "  tabs\tand\nnewlines  ", ""]


@pytest.fixture
def tokenizer() -> ByteTokenizer:
    return get_tokenizer(ModelConfig())


def test_ids_are_bos_then_utf8_bytes(tokenizer):
    assert tokenizer.encode("hé") == [tokenizer.bos_id, *"hé".encode()]
    assert tokenizer.encode("a", add_bos=False, add_eos=True) == [ord("a"), tokenizer.eos_id]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_and_vocabulary_bounds(tokenizer, text):
    ids = tokenizer.encode(text, add_eos=True)
    assert tokenizer.decode(ids) == text
    assert all(0 <= i < tokenizer.vocab_size for i in ids)


def test_token_strings_label_specials_and_bytes(tokenizer):
    ids = tokenizer.encode("a \n", add_eos=True)
    assert tokenizer.token_strings(ids) == ["<bos>", "a", "\u2423", "<0x0A>", "<eos>"]


def byte_level_bpe(tmp_path, texts: list[str]):
    """A byte-level BPE (GPT-2's kind) trained here on `texts`, through HFTokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from attnserve.model.tokenizer import HFTokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe.train_from_iterator(
        texts * 10, trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet)
    )
    bpe.save(str(tmp_path / "tokenizer.json"))
    return HFTokenizer(tmp_path / "tokenizer.json")


def test_byte_level_pieces_show_the_text_or_the_bytes_they_stand_for(tmp_path):
    """A whole character shows as itself; a piece that is part of one (each of an emoji's
    four bytes, when no merge covers them) shows its bytes, never a replacement character."""
    tokenizer = byte_level_bpe(tmp_path, ["hello world café"])
    ids = tokenizer.encode("café 🙂")
    labels = tokenizer.token_strings(ids)
    assert labels[:3] == ["caf", "é", "\u2423"]
    assert labels[3:] == [f"<0x{b:02X}>" for b in "🙂".encode()]
    assert "\ufffd" not in "".join(labels)
    assert tokenizer.decode(ids) == "café 🙂"
