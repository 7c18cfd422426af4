"""The generator's policy with a fake decode batch (the running batch's bookkeeping, not ONNX
Runtime, is the subject): prompts join between steps, one at a time, up to the running
limit; ended texts leave; each text gets its own row's tokens. And a text's release of its
decoded characters: nothing of a stop string or a half-spelled character goes out early."""

from __future__ import annotations

import asyncio
import itertools
import threading

import numpy as np
import pytest

from attnserve.model.config import ModelConfig
from attnserve.model.tokenizer import ByteTokenizer
from attnserve.service.core.generation import GenerationPlan, Generator, Token, _Text
from attnserve.service.core.sampling import Choice, Sampling
from tests.tokenizer_styles import STYLES

CONFIG = ModelConfig(n_layers=1, n_heads=1, d_model=8, d_ff=8, max_seq_len=64)
V = CONFIG.vocab_size


class CountingBatch:
    """Each row's next token is its last one plus one: a text from prompt [p] is p+1, p+2, ..."""

    def __init__(self, calls: list[tuple[str, int]]) -> None:
        self.calls = calls
        self.last: list[int] = []

    @property
    def rows(self) -> int:
        return len(self.last)

    @property
    def cache_bytes(self) -> int:
        return 0

    def add(self, prompt, prompt_changes, step_changes) -> np.ndarray:
        self.last.append(int(prompt[-1]))
        self.calls.append(("add", self.rows))
        return np.eye(V, dtype=np.float32)[(self.last[-1] + 1) % V]

    def step(self, tokens) -> np.ndarray:
        self.calls.append(("step", self.rows))
        assert len(tokens) == self.rows
        self.last = [int(t) for t in tokens]
        return np.eye(V, dtype=np.float32)[[(t + 1) % V for t in self.last]]

    def remove(self, row: int) -> None:
        self.calls.append(("remove", row))
        del self.last[row]


class FakeBackend:
    config = CONFIG

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def decode_batch(self) -> CountingBatch:
        return CountingBatch(self.calls)


def plan(first: int, n: int) -> GenerationPlan:
    return GenerationPlan(np.array([first], dtype=np.int64), n, Sampling(temperature=0.0))


def test_prompts_join_one_between_steps_up_to_the_limit_and_ended_texts_leave():
    backend = FakeBackend()

    async def run() -> list[list[int]]:
        generator = Generator(backend, ByteTokenizer(CONFIG), max_running=2)

        async def text(first: int, n: int) -> list[int]:
            return [t.token_id async for t in generator.generate(plan(first, n))]

        texts = await asyncio.gather(text(10, 5), text(40, 3), text(70, 4))
        while generator.running:  # the last text leaves at the loop's next turn
            await asyncio.sleep(0)
        await generator.stop("done")
        return texts

    texts = asyncio.run(run())
    assert texts == [list(range(11, 16)), [41, 42, 43], [71, 72, 73, 74]]
    rows = [n for call, n in backend.calls if call in ("add", "step")]
    assert max(rows) == 2  # the third waited for a row
    kinds = [call for call, _ in backend.calls]
    assert ("add", "add") not in set(itertools.pairwise(kinds))  # a step between two prompts
    assert kinds.count("add") == 3 and kinds.count("remove") == 3


def test_a_text_that_ends_early_leaves_and_the_others_go_on():
    backend = FakeBackend()

    async def run() -> tuple[list[int], list[int]]:
        generator = Generator(backend, ByteTokenizer(CONFIG))
        stream = generator.generate(plan(10, 50))
        first = [(await anext(stream)).token_id]
        await stream.aclose()  # the client went away
        other = [t.token_id async for t in generator.generate(plan(20, 3))]
        await generator.stop("done")
        return first, other

    first, other = asyncio.run(run())
    assert first == [11] and other == [21, 22, 23]
    assert ("remove", 0) in backend.calls


def released(text: str, stop: tuple[str, ...] = (), n: int = 100) -> list[tuple[str, str | None]]:
    """Each token's released text and finish reason, for `text`'s bytes as tokens."""
    planned = GenerationPlan(np.array([1]), max_tokens=n, stop=stop)
    made = _Text(planned, ByteTokenizer(CONFIG), CONFIG.max_seq_len)
    out = []
    for byte in text.encode():
        made.take(Choice(byte))
        token = made.queue.get_nowait()
        assert not isinstance(token, BaseException)
        out.append((token.text, token.finish_reason))
        if token.finish_reason:
            break
    return out


def test_a_stop_string_is_held_back_until_it_is_known_and_cut():
    out = released("the cat sat", stop=("cat",))
    assert "".join(text for text, _ in out) == "the "
    assert out[-1] == ("", "stop")
    assert [text for text, _ in out[4:6]] == ["", ""]  # "c", "ca": maybe the stop string
    # a prefix that turns out not to be one is released with the token that says so
    out = released("the cap", stop=("cat",))
    assert [text for text, _ in out] == ["t", "h", "e", " ", "", "", "cap"]


def test_half_a_character_waits_for_the_rest():
    out = released("aé!", n=4)
    assert [text for text, _ in out] == ["a", "", "é", "!"]
    assert released("ab", n=2)[-1] == ("b", "length")


class GatedRemoveBatch(CountingBatch):
    """A CountingBatch whose first remove() waits until the test lets it go."""

    def __init__(self, calls: list[tuple[str, int]]) -> None:
        super().__init__(calls)
        self.entered, self.release = threading.Event(), threading.Event()

    def remove(self, row: int) -> None:
        self.entered.set()
        self.release.wait(30)
        super().remove(row)


def test_a_text_that_leaves_while_another_is_removed_keeps_its_row_until_it_goes():
    backend = FakeBackend()
    batch = GatedRemoveBatch(backend.calls)
    backend.decode_batch = lambda: batch  # type: ignore[method-assign]

    async def run() -> list[int]:
        generator = Generator(backend, ByteTokenizer(CONFIG))
        a, b, c = (generator.generate(plan(first, 20)) for first in (10, 40, 70))
        for stream in (a, b, c):  # all three joined, rows 0, 1, 2
            await anext(stream)
        await a.aclose()  # row 0 goes ...
        await asyncio.to_thread(batch.entered.wait, 30)
        await b.aclose()  # ... and row 1's client leaves while it does
        batch.release.set()
        rest = [t.token_id async for t in c]
        while generator.running:
            await asyncio.sleep(0)
        await generator.stop("done")
        return rest

    rest = asyncio.run(run())
    assert rest == list(range(72, 91))  # the third text's own tokens, to its end
    assert batch.rows == 0  # every row went with its text
    removed = [row for call, row in backend.calls if call == "remove"]
    assert removed[0] == 0 and len(removed) == 3


def _hf_tokenizer(style: str, tmp_path):
    from attnserve.model.tokenizer import HFTokenizer
    from tests.tokenizer_styles import save

    return HFTokenizer(save(style, tmp_path / "tokenizer.json"))


GENERATED = " Paris, ville lumière ☕🙂 é\tand  two spaces. The cat sat on the mat. Ça va?"


def _texts(tokenizer, prompt: list[int], ids: list[int], stop=()) -> list[Token]:
    """The tokens a text of `ids` after `prompt` releases (ended by its length or a stop)."""
    planned = GenerationPlan(np.array(prompt), max_tokens=len(ids), stop=stop)
    made = _Text(planned, tokenizer, 10_000)
    out = []
    for token_id in ids:
        made.take(Choice(token_id))
        token = made.queue.get_nowait()
        assert not isinstance(token, BaseException)
        out.append(token)
        if token.finish_reason:
            break
    return out


@pytest.mark.parametrize("style", ["byte", *STYLES])
def test_generated_text_is_the_tokenizers_decode_of_the_whole_less_the_prompt(style, tmp_path):
    """A text of 64 tokens (accents, emoji spelled by several tokens, spaces, a few tokens
    drawn at random), ended after each of its tokens in turn: its text is the tokenizer's
    own decode(prompt + generated) less decode(prompt) (where that ends mid-character, the
    unfinished character is one U+FFFD: byte fallback replaces the characters of its run
    completed before it too, which had gone out), and as it runs, what was released is a
    start of the whole. Decoding the generated ids alone loses SentencePiece's first space
    ("isParis")."""
    tokenizer = ByteTokenizer(CONFIG) if style == "byte" else _hf_tokenizer(style, tmp_path)
    prompt = list(tokenizer.encode("The capital of France is"))
    rng = np.random.default_rng(7)
    ids = list(tokenizer.token_ids(GENERATED))
    # random tokens between characters, and no lone byte pieces: byte fallback replaces a
    # whole run of byte pieces that is not UTF-8, characters completed before the bad byte
    # included (a stream has sent those; the tokenizer's decode takes them back)
    vocab = CONFIG.vocab_size if style == "byte" else tokenizer._tokenizer.get_vocab_size()
    pieces = [i for i in range(vocab) if not tokenizer.token_strings([i])[0].startswith("<0x")]
    between = [at for at in range(len(ids)) if not tokenizer.decode(ids[:at]).endswith("\ufffd")]
    for at in sorted(rng.choice(between, 4, replace=False), reverse=True):
        ids.insert(int(at), int(rng.choice(pieces)))
    ids = (ids * 3)[:64]
    start = len(tokenizer.decode(prompt))
    final = tokenizer.decode([*prompt, *ids])[start:]
    for n in range(1, len(ids) + 1):
        tokens = _texts(tokenizer, prompt, ids[:n])
        assert tokens[-1].finish_reason == "length" and len(tokens) == n
        text = "".join(t.text for t in tokens)
        whole = tokenizer.decode([*prompt, *ids[:n]])[start:]
        if whole.endswith("\ufffd") and text != whole:  # ends mid-character
            assert text.endswith("\ufffd") and final.startswith(text[:-1]), (n, text, whole)
        else:
            assert text == whole, (n, text, whole)
        released = "".join(t.text for t in tokens[:-1])
        assert final.startswith(released)
    if style in ("metaspace", "llama2"):  # the defect: the generated ids decoded alone
        assert tokenizer.decode(ids) != final


@pytest.mark.parametrize("style", ["byte", *STYLES])
def test_stop_strings_cut_the_text_as_the_tokenizer_writes_it(style, tmp_path):
    tokenizer = ByteTokenizer(CONFIG) if style == "byte" else _hf_tokenizer(style, tmp_path)
    prompt = list(tokenizer.encode("The capital of France is"))
    ids = tokenizer.token_ids(" Paris. The cat sat on the mat.")
    whole = tokenizer.decode([*prompt, *ids])[len(tokenizer.decode(prompt)) :]
    tokens = _texts(tokenizer, prompt, ids, stop=("cat sat",))
    assert tokens[-1].finish_reason == "stop"
    assert "".join(t.text for t in tokens) == whole[: whole.index("cat sat")]
