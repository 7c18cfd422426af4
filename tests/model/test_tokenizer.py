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
