"""Generation's policy in the engine, with a fake decode batch (the running batch's
bookkeeping and the engine's choices, not ONNX Runtime, are the subject): prompts join
between steps, in chunks while other work waits, up to the running limit; ended texts leave;
each text gets its own row's tokens; Encodes and texts share the cores."""

from __future__ import annotations

import asyncio
import itertools
import threading

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.service.core.batching import BatcherOptions
from attnserve.service.core.engine import GENERATION_SHARE, Engine
from attnserve.service.core.metrics import Metrics
from attnserve.service.generate.plan import GenerationPlan
from attnserve.service.generate.sampling import Sampling
from attnserve.service.generate.scheduler import PREFILL_CHUNK
from tests.service.fakes import FakeBackend

CONFIG = ModelConfig(n_layers=1, n_heads=1, d_model=8, d_ff=8, max_seq_len=512)
V = CONFIG.vocab_size


class CountingRun:
    def __init__(self, batch: CountingBatch, prompt: np.ndarray) -> None:
        self.batch, self.prompt, self.done = batch, prompt, 0

    def advance(self, tokens: int) -> np.ndarray | None:
        self.done = min(self.done + tokens, len(self.prompt))
        self.batch.record("prefill", self.done)
        return (
            np.eye(V, dtype=np.float32)[(self.prompt[-1] + 1) % V]
            if self.done == len(self.prompt)
            else None
        )


class CountingBatch:
    """Each row's next token is its last one plus one: a text from prompt [..., p] makes
    p+1, p+2, ...; each call costs `step_s` on the backend's clock."""

    def __init__(self, backend: TimedBackend) -> None:
        self.backend = backend
        self.last: list[int] = []

    def record(self, call: str, n: int) -> None:
        self.backend.record(call, n)

    @property
    def rows(self) -> int:
        return len(self.last)

    @property
    def cache_bytes(self) -> int:
        return 0

    def prefill(self, prompt, changes) -> CountingRun:
        return CountingRun(self, prompt)

    def join(self, run: CountingRun, step_changes) -> None:
        self.last.append(int(run.prompt[-1]))
        self.record("join", self.rows)

    def step(self, tokens) -> np.ndarray:
        assert len(tokens) == self.rows
        self.record("step", self.rows)
        self.last = [int(t) for t in tokens]
        return np.eye(V, dtype=np.float32)[[(t + 1) % V for t in self.last]]

    def remove(self, row: int) -> None:
        self.record("remove", row)
        del self.last[row]


class StepClock:
    """Time that moves by what each backend call costs (from the worker thread)."""

    def __init__(self) -> None:
        self.time = 0.0

    def now(self) -> float:
        return self.time

    async def wait(self, event: asyncio.Event, timeout: float) -> None:
        await event.wait()


class TimedBackend(FakeBackend):
    """FakeBackend whose Encodes cost `encode_s` and decode pieces `step_s` of the clock's
    time; it also generates (CountingBatch)."""

    def __init__(self, encode_s: float = 0.129, step_s: float = 0.03) -> None:
        super().__init__(CONFIG)
        self.clock = StepClock()
        self.encode_s, self.step_s = encode_s, step_s
        self.log: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.batch = CountingBatch(self)

    def decode_batch(self) -> CountingBatch:
        return self.batch

    def record(self, call: str, n: int) -> None:
        with self.lock:
            self.log.append((call, n))
            if call in ("prefill", "step"):
                self.clock.time += self.step_s

    def embed(self, input_ids: np.ndarray) -> np.ndarray:
        with self.lock:
            self.log.append(("embed", input_ids.shape[1]))
            self.clock.time += self.encode_s
        return super().embed(input_ids)


def engine(backend: TimedBackend, max_running: int = 16) -> Engine:
    options = BatcherOptions(max_batch_tokens=512, inline_max_s=0.0)
    made = Engine(backend, options, Metrics().for_model("fake", "1"), backend.clock)
    made.generation.max_running = max_running
    made.start()
    return made


def plan(first: int, n: int, prompt_len: int = 1) -> GenerationPlan:
    prompt = np.full(prompt_len, first, dtype=np.int64)
    return GenerationPlan(prompt, n, Sampling(temperature=0.0))


async def ids_of(e: Engine, p: GenerationPlan) -> list[int]:
    return [m.choice.token_id async for m in e.generate(p)]


async def settled(e: Engine) -> None:
    while e.generation.has_work:  # the last text leaves at the next piece
        await asyncio.sleep(0)


def test_prompts_join_between_steps_up_to_the_limit_and_ended_texts_leave():
    backend = TimedBackend()

    async def run() -> list[list[int]]:
        e = engine(backend, max_running=2)
        texts = await asyncio.gather(
            ids_of(e, plan(10, 5)), ids_of(e, plan(40, 3)), ids_of(e, plan(70, 4))
        )
        await settled(e)
        await e.stop()
        return texts

    texts = asyncio.run(run())
    assert texts == [list(range(11, 16)), [41, 42, 43], [71, 72, 73, 74]]
    rows = [n for call, n in backend.log if call in ("join", "step")]
    assert max(rows) == 2  # the third waited for a row
    kinds = [call for call, _ in backend.log if call != "prefill"]
    assert ("join", "join") not in set(itertools.pairwise(kinds))  # a step between two prompts
    assert kinds.count("join") == 3 and kinds.count("remove") == 3


def test_a_text_that_ends_early_leaves_and_the_others_go_on():
    backend = TimedBackend()

    async def run() -> tuple[list[int], list[int]]:
        e = engine(backend)
        stream = e.generate(plan(10, 50))
        first = [(await anext(stream)).choice.token_id]
        await stream.aclose()  # the client went away
        other = await ids_of(e, plan(20, 3))
        await e.stop()
        return first, other

    first, other = asyncio.run(run())
    assert first == [11] and other == [21, 22, 23]
    assert ("remove", 0) in backend.log


def test_a_long_prompt_runs_in_chunks_between_the_running_texts_steps():
    backend = TimedBackend()
    long = 3 * PREFILL_CHUNK + 5

    async def run() -> list[int]:
        e = engine(backend)
        stream = e.generate(plan(10, 100))
        await anext(stream)  # running
        tokens = await ids_of(e, plan(40, 2, prompt_len=long))
        await stream.aclose()
        await settled(e)
        await e.stop()
        return tokens

    assert asyncio.run(run()) == [41, 42]
    chunks = [n for call, n in backend.log if call == "prefill"][1:]  # after the first text's
    assert chunks == [PREFILL_CHUNK, 2 * PREFILL_CHUNK, 3 * PREFILL_CHUNK, long]
    calls = [call for call, _ in backend.log]
    start = calls.index("prefill", 1)
    between = calls[start : calls.index("join", start)]
    # the running text made a token between every two chunks
    assert [c for c in between if c != "remove"] == ["prefill", "step"] * 3 + ["prefill"]


def test_an_encode_waits_for_one_piece_of_generation_not_for_the_texts():
    backend = TimedBackend()

    async def run() -> None:
        e = engine(backend)
        streams = [e.generate(plan(10 * i, 200)) for i in range(1, 9)]
        for stream in streams:
            await anext(stream)
        steps_before = sum(call == "step" for call, _ in backend.log)
        await e.encode([np.arange(128, dtype=np.int64)])
        steps_after = sum(call == "step" for call, _ in backend.log)
        assert steps_after - steps_before <= 1
        for stream in streams:
            await stream.aclose()
        await settled(e)
        await e.stop()

    asyncio.run(run())


def test_texts_and_encodes_that_keep_coming_share_the_cores():
    """Encodes one after another while two texts generate: of the time both waited, the
    texts get GENERATION_SHARE (on the backend's clock), the Encodes the rest, and neither
    starves."""
    backend = TimedBackend(encode_s=0.129, step_s=0.03)

    async def run() -> None:
        e = engine(backend)
        done = asyncio.Event()

        async def encodes() -> None:
            while not done.is_set():
                await e.encode([np.arange(128, dtype=np.int64)])

        texts = asyncio.gather(ids_of(e, plan(10, 300)), ids_of(e, plan(20, 300)))
        client = asyncio.create_task(encodes())
        await texts
        done.set()
        await client
        await e.stop()

    asyncio.run(run())
    calls = [call for call, _ in backend.log]
    last_step = len(calls) - calls[::-1].index("step")
    both = calls[calls.index("embed") : last_step]  # while both kinds waited
    encode_s = both.count("embed") * backend.encode_s
    generate_s = (both.count("step") + both.count("prefill")) * backend.step_s
    share = generate_s / (generate_s + encode_s)
    assert abs(share - GENERATION_SHARE) < 0.05, share
