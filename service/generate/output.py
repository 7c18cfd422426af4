"""The output processor: a text's chosen tokens turned into what its client reads, outside
the engine's loop (as vLLM's output processor detokenizes off the scheduler). Each token's
characters are decoded in the prompt's context (as the tokenizer writes the whole text), and
what may still become a stop string is held back: work per token does not grow with the
text's length."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass

from attnserve.model.tokenizer import Tokenizer
from attnserve.service.generate.plan import GenerationPlan
from attnserve.service.generate.sampling import Choice


@dataclass(frozen=True)
class Made:
    """A chosen token as the engine hands it to the text's stream; `reason` where the
    engine ended the text: "stop" (a stop id), "length"."""

    choice: Choice
    reason: str | None = None


@dataclass(frozen=True)
class Token:
    """One generated token, as the transports send it."""

    token_id: int
    text: str  # what it adds to the text (held back while a stop string may be forming)
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()  # the most probable alternatives, (id, logprob)
    finish_reason: str | None = None  # on the last: "stop" (a stop id or string), "length"


class TextOutput:
    """One text's characters: decoded token by token, released but for a stop string's
    possible start, cut at the first stop string."""

    def __init__(self, plan: GenerationPlan, tokenizer: Tokenizer) -> None:
        self.plan = plan
        self.decoder = tokenizer.stream(plan.prompt.tolist())
        self.pending = ""  # characters decoded but not released: maybe a stop string's start

    def take(self, choice: Choice, reason: str | None) -> Token:
        """The token of `choice` with the text it releases. `reason`: the engine's end of
        the text ("stop" at a stop id, "length"), or None; a stop string ends it here."""
        if reason != "stop":  # a stop id writes no text
            self.pending += self.decoder.step(choice.token_id)
        cut = min((i for s in self.plan.stop if (i := self.pending.find(s)) >= 0), default=-1)
        if cut >= 0:
            reason, text = "stop", self.pending[:cut]
        elif reason is not None:
            text = self.pending + self.decoder.rest()
        else:
            text = self._release()
        return Token(choice.token_id, text, choice.logprob, choice.top, reason)

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


async def detokenized(
    made: AsyncIterator[Made], plan: GenerationPlan, tokenizer: Tokenizer
) -> AsyncGenerator[Token, None]:
    """A text's tokens from the engine's choices; ends at its last (leaving `made` then
    ends the text in the engine, a stop string's included)."""
    output = TextOutput(plan, tokenizer)
    async for item in made:
        token = output.take(item.choice, item.reason)
        yield token
        if token.finish_reason is not None:
            return


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
