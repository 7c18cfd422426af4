"""Generation: texts continued token by token, their decode steps batched together.

One loop per model runs a running batch (core.backend.DecodeBatch): between two steps it
takes in at most one waiting prompt (run alone, so a long prompt delays the running texts
by one prompt's time, not more), then runs one step of every text at once; a text leaves
the batch the step after it ends, or after its client went away. On CPU a decode step reads
every weight once whatever the batch, so eight texts cost little more than one. The model
runs on one worker thread, off the event loop; the loop hands each text its tokens.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from attnserve.model.config import ModelConfig
from attnserve.model.tokenizer import Tokenizer
from attnserve.service.core.backend import Backend, DecodeBatch, SiteChange
from attnserve.service.core.errors import NotReadyError
from attnserve.service.core.interventions import changes_bytes
from attnserve.service.core.sampling import Choice, Sampling, choose

log = logging.getLogger(__name__)

# Texts generated at once: past this, a decode step's matrix products stop being bound by
# reading the weights, and every text waits longer for each token.
MAX_RUNNING = 16


@dataclass(frozen=True, eq=False)
class GenerationPlan:
    """One text to continue, validated (core/generation_plan.py)."""

    prompt: np.ndarray  # int64 (T,)
    max_tokens: int  # at most this many, and no further than the model's context
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[str, ...] = ()  # the text ends before the first of these it makes
    stop_ids: frozenset[int] = frozenset()  # ... or at one of these tokens (EOS's included)
    prompt_changes: Mapping[str, SiteChange] = field(default_factory=dict)
    step_changes: Mapping[str, SiteChange] = field(default_factory=dict)  # at each new token


@dataclass(frozen=True)
class Token:
    """One generated token, as the transports send it."""

    token_id: int
    text: str  # what it adds to the text (held back while a stop string may be forming)
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()  # the most probable alternatives, (id, logprob)
    finish_reason: str | None = None  # on the last: "stop" (a stop id or string), "length"


def generation_bytes(plan: GenerationPlan, config: ModelConfig) -> int:
    """What a text holds at its longest: each layer's keys and values of every position,
    twice (a step's past and the step's output beside it), and its changes."""
    positions = min(len(plan.prompt) + plan.max_tokens, config.max_seq_len) + 1
    per_position = 2 * config.n_layers * config.kv_heads * config.head_dim * 4
    return 2 * positions * per_position + changes_bytes(plan.prompt_changes)


async def interleaved(streams: Sequence[AsyncIterator[Token]]) -> AsyncIterator[tuple[int, Token]]:
    """The tokens of several texts as (the text's index, token), in the order they come."""
    if len(streams) == 1:
        async for token in streams[0]:
            yield 0, token
        return
    queue: asyncio.Queue[tuple[int, Token] | BaseException | None] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[Token]) -> None:
        try:
            async for token in stream:
                queue.put_nowait((index, token))
        except Exception as exc:
            queue.put_nowait(exc)
        finally:
            queue.put_nowait(None)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Text:
    """A text being generated: its tokens, their characters (decoded in the prompt's
    context, as the tokenizer writes the whole text), what of them is not released yet,
    and the queue its stream reads."""

    def __init__(self, plan: GenerationPlan, tokenizer: Tokenizer, context: int) -> None:
        self.plan = plan
        # the context bounds the text: its last token needs no position of its own
        self.limit = min(plan.max_tokens, context - len(plan.prompt) + 1)
        self.ids: list[int] = []
        self.decoder = tokenizer.stream(plan.prompt.tolist())
        self.pending = ""  # characters decoded but not released: maybe a stop string's start
        self.rng = np.random.default_rng(plan.sampling.seed)
        self.queue: asyncio.Queue[Token | BaseException] = asyncio.Queue()
        self.ended = False  # its last token is out, or its client went away

    def take(self, choice: Choice) -> None:
        """Queue the chosen token with the text it releases; end the text where it must.
        Stop strings are looked for in the characters not released yet only: a text's
        work per token does not grow with its length."""
        self.ids.append(choice.token_id)
        stopped = choice.token_id in self.plan.stop_ids  # a stop id writes no text
        if not stopped:
            self.pending += self.decoder.step(choice.token_id)
        cut = min((i for s in self.plan.stop if (i := self.pending.find(s)) >= 0), default=-1)
        reason = None
        if cut >= 0:
            reason, text = "stop", self.pending[:cut]
        elif stopped or len(self.ids) >= self.limit:
            reason, text = "stop" if stopped else "length", self.pending + self.decoder.rest()
        else:
            text = self._release()
        self.ended = reason is not None
        self.queue.put_nowait(Token(choice.token_id, text, choice.logprob, choice.top, reason))

    def _release(self) -> str:
        """What of the pending characters may go: all but their longest end that a stop
        string begins with."""
        held = 0
        for stop in self.plan.stop:
            for n in range(min(len(stop) - 1, len(self.pending)), held, -1):
                if self.pending.endswith(stop[:n]):
                    held = n
                    break
        cut = len(self.pending) - held
        released, self.pending = self.pending[:cut], self.pending[cut:]
        return released


class Generator:
    """The running batch of one model and the loop that drives it."""

    def __init__(
        self,
        backend: Backend,
        tokenizer: Tokenizer,
        max_running: int = MAX_RUNNING,
        on_token: Callable[[], None] | None = None,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.max_running = max_running
        self.on_token = on_token or (lambda: None)  # a metric's count, per token generated
        self._waiting: collections.deque[_Text] = collections.deque()
        self._running: list[_Text] = []
        self._wake = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="attnserve-generate")
        self._batch: DecodeBatch | None = None
        self._task: asyncio.Task | None = None

    @property
    def running(self) -> int:
        return len(self._running)

    async def generate(self, plan: GenerationPlan) -> AsyncGenerator[Token, None]:
        """The text's tokens as they are made; leaving the iteration early (the client went
        away) takes the text out of the batch at the next step."""
        text = _Text(plan, self.tokenizer, self.backend.config.max_seq_len)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._loop(), name="attnserve-generate")
        self._waiting.append(text)
        self._wake.set()
        try:
            while True:
                item = await text.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            text.ended = True
            self._wake.set()

    async def stop(self, reason: str) -> None:
        """Stop the loop; the texts still being made end with NotReadyError(reason). Once
        stopped, stopping again does nothing."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for text in (*self._running, *self._waiting):
            text.queue.put_nowait(NotReadyError(reason))
        self._running.clear()
        self._waiting.clear()
        self._executor.shutdown(wait=True)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            try:
                await self._leave()
                if self._waiting and len(self._running) < self.max_running:
                    text = self._waiting.popleft()
                    if not text.ended:
                        choice = await loop.run_in_executor(self._executor, self._join, text)
                        self._running.append(text)
                        self._take(text, choice)
                        await self._leave()
                if self._running:
                    choices = await loop.run_in_executor(self._executor, self._step)
                    for text, choice in zip(self._running, choices, strict=True):
                        self._take(text, choice)
                await asyncio.sleep(0)  # let the streams send what they were given
            except Exception as exc:  # the model failed: every text being made fails with it
                log.exception("generation failed")
                for text in (*self._running, *self._waiting):
                    text.queue.put_nowait(exc)
                self._running.clear()
                self._waiting.clear()
                self._batch = None

    def _take(self, text: _Text, choice: Choice) -> None:
        if not text.ended:
            text.take(choice)
            self.on_token()

    async def _leave(self) -> None:
        """Take the texts that ended out of the batch.

        Clients go away at any await, this one included: only the rows taken out of the
        batch leave the running list, so a text that ends meanwhile keeps its row until the
        next turn (dropping it from the list alone would shift every later row's cache)."""
        ended = [row for row, text in enumerate(self._running) if text.ended]
        if ended:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._remove, ended)
            gone = set(ended)
            self._running = [text for row, text in enumerate(self._running) if row not in gone]

    # On the worker thread:

    def _join(self, text: _Text) -> Choice:
        if self._batch is None:
            self._batch = self.backend.decode_batch()
        plan = text.plan
        logits = self._batch.add(plan.prompt, plan.prompt_changes, plan.step_changes)
        return choose(logits, plan.sampling, text.rng)

    def _step(self) -> list[Choice]:
        assert self._batch is not None
        logits = self._batch.step([text.ids[-1] for text in self._running])
        return [
            choose(row, text.plan.sampling, text.rng)
            for row, text in zip(logits, self._running, strict=True)
        ]

    def _remove(self, rows: list[int]) -> None:
        assert self._batch is not None
        for row in reversed(rows):
            self._batch.remove(row)
