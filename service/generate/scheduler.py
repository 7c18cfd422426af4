"""The generation side of a model's engine (core/engine.py): the texts waiting, the prompt
being prefilled and the running batch (core.backend.DecodeBatch), and the next piece of work
they need, which the engine runs when its turn comes.

Each piece is short: one decode step of every running text at once (on CPU a step reads
every weight once whatever the batch, so eight texts cost little more than one), or one
chunk of a prompt (PREFILL_CHUNK tokens while anything else waits, so a long prompt delays
the running texts and the queued Encodes by a chunk's time, not the prompt's). Prefill
chunks and steps take turns. A text leaves the batch at the piece after it ends, or after
its client went away. The engine hands each text its chosen tokens; detokenizing and stop
strings happen in the text's stream (generate/output.py), off the loop.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from attnserve.service.core.backend import Backend, DecodeBatch, PromptRun
from attnserve.service.generate.output import Made
from attnserve.service.generate.plan import GenerationPlan
from attnserve.service.generate.sampling import Choice, choose

# Texts generated at once: past this, a decode step's matrix products stop being bound by
# reading the weights, and every text waits longer for each token.
MAX_RUNNING = 16
# A prompt's tokens per run while other work waits (a whole prompt runs at once otherwise).
PREFILL_CHUNK = 64


@dataclass(eq=False)
class Text:
    """A text being generated, as the engine sees it: ids, not characters."""

    plan: GenerationPlan
    limit: int  # tokens it may make: max_tokens, within the context
    rng: np.random.Generator
    ids: list[int] = field(default_factory=list)
    queue: asyncio.Queue[Made | BaseException] = field(default_factory=asyncio.Queue)
    ended: bool = False  # its last token is out, or its client went away
    prompt_run: PromptRun | None = None  # while its prompt is being prefilled

    def take(self, choice: Choice) -> None:
        """Hand the chosen token to the stream; end the text at a stop id or its limit."""
        self.ids.append(choice.token_id)
        reason = None
        if choice.token_id in self.plan.stop_ids:
            reason = "stop"
        elif len(self.ids) >= self.limit:
            reason = "length"
        self.ended = reason is not None
        self.queue.put_nowait(Made(choice, reason))

    def fail(self, exc: BaseException) -> None:
        self.ended = True
        self.queue.put_nowait(exc)


@dataclass(frozen=True)
class Work:
    """One piece of generation: `run` on the engine's worker thread, then `finish` with
    what it returned, on the loop."""

    run: Callable[[], object]
    finish: Callable[[object], None]


class Generation:
    """The texts of one model being generated, and what they need next."""

    def __init__(
        self,
        backend: Backend,
        max_running: int = MAX_RUNNING,
        on_token: Callable[[], None] | None = None,
    ) -> None:
        self.backend = backend
        self.max_running = max_running
        self.on_token = on_token or (lambda: None)  # a metric's count, per token generated
        self.waiting: collections.deque[Text] = collections.deque()
        self.running: list[Text] = []  # row i of the batch is running[i]
        self._batch: DecodeBatch | None = None  # opened at the first prompt (on the worker)
        self._stepped = False  # the last piece was a step: a prompt's chunk is next
        self._epoch = 0  # counts failures: a piece that ran before one finishes nothing

    def submit(self, plan: GenerationPlan) -> Text:
        # the context bounds the text: its last token needs no position of its own
        limit = min(plan.max_tokens, self.backend.config.max_seq_len - len(plan.prompt) + 1)
        text = Text(plan, limit, np.random.default_rng(plan.sampling.seed))
        self.waiting.append(text)
        return text

    @property
    def has_work(self) -> bool:
        self._forget_waiting_ended()
        return bool(self.waiting) or bool(self.running)

    def next_work(self, others_wait: bool) -> Work:
        """The next piece (has_work must be true). `others_wait`: Encodes are queued too,
        so a prompt runs in chunks even with no text running."""
        gone = [row for row, text in enumerate(self.running) if text.ended]
        live = [text for text in self.running if not text.ended]
        if self.waiting and len(live) < self.max_running and (not live or self._stepped):
            self._stepped = False
            chunk = PREFILL_CHUNK if live or others_wait else 0
            return self._prefill(gone, self.waiting[0], chunk)
        self._stepped = True
        return self._step(gone, live)

    def fail(self, exc: BaseException) -> None:
        """The model failed, or the server stops: every text ends with `exc`."""
        for text in (*self.running, *self.waiting):
            if not text.ended:
                text.fail(exc)
        self.running.clear()
        self.waiting.clear()
        self._batch = None
        self._epoch += 1

    def _forget_waiting_ended(self) -> None:
        """Texts whose clients left before their prompt ran take no work."""
        self.waiting = collections.deque(
            t for t in self.waiting if not t.ended or t.prompt_run is not None
        )

    def _leave(self, gone: list[int]) -> None:
        """Rows of ended texts leave, on the loop, after the worker took them out of the
        batch. Clients go away at any await: only the rows taken out leave the list, so a
        text that ends meanwhile keeps its row until the next piece (dropping it from the
        list alone would shift every later row's cache)."""
        if gone:
            out = set(gone)
            self.running = [text for row, text in enumerate(self.running) if row not in out]

    def _remove(self, gone: list[int]) -> DecodeBatch:
        """On the worker: the ended texts' rows out; the batch (opened at first use)."""
        if self._batch is None:
            self._batch = self.backend.decode_batch()
        for row in reversed(gone):
            self._batch.remove(row)
        return self._batch

    def _prefill(self, gone: list[int], text: Text, chunk: int) -> Work:
        plan = text.plan

        def run() -> Choice | None:
            batch = self._remove(gone)
            if text.ended:  # its client left: the rest of its prompt is not run
                return None
            if text.prompt_run is None:
                text.prompt_run = batch.prefill(plan.prompt, plan.prompt_changes)
            logits = text.prompt_run.advance(chunk or len(plan.prompt))
            if logits is None:
                return None
            batch.join(text.prompt_run, plan.step_changes)
            return choose(logits, plan.sampling, text.rng)

        def finish(choice: object) -> None:
            self._leave(gone)
            if text.ended and text in self.waiting and choice is None:
                self.waiting.remove(text)
            if not isinstance(choice, Choice):
                return
            self.waiting.remove(text)
            text.prompt_run = None
            self.running.append(text)  # its row is the batch's last, ended or not
            self._give(text, choice)

        return self._work(run, finish)

    def _step(self, gone: list[int], live: list[Text]) -> Work:
        def run() -> list[Choice]:
            batch = self._remove(gone)
            if not live:
                return []
            logits = batch.step([text.ids[-1] for text in live])
            return [
                choose(row, text.plan.sampling, text.rng)
                for row, text in zip(logits, live, strict=True)
            ]

        def finish(choices: object) -> None:
            self._leave(gone)
            assert isinstance(choices, list)
            for text, choice in zip(live, choices, strict=True):
                self._give(text, choice)

        return self._work(run, finish)

    def _work(self, run: Callable[[], object], finish: Callable[[object], None]) -> Work:
        epoch = self._epoch

        def finish_unless_failed(result: object) -> None:
            if self._epoch == epoch:  # else every text it ran has ended already
                finish(result)

        return Work(run, finish_unless_failed)

    def _give(self, text: Text, choice: Choice) -> None:
        if not text.ended:
            text.take(choice)
            self.on_token()
