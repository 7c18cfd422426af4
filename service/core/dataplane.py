"""What every transport calls for one model version: admission, one pass from request to
response, model info.

A transport finds the data plane of the model a request names inside
`ModelRepository.observed` (core/repository.py: the request metrics and the log of
unexpected errors, so every transport counts alike), turns its wire format into inputs and
EncodeOptions (core/request.py), enters `DataPlane.results`, builds its answer from the
arrays, and maps the typed errors it raises (core/status.py). The data plane owns
readiness and draining (so every transport refuses alike), plans the request once,
reserves its room in the process's memory budget and hands the work to the engine;
it never sees gRPC, HTTP or any API's messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from typing import Any

import numpy as np

from attnserve.model.tokenizer import Tokenizer
from attnserve.service.circuits.attribute import Attribution, Done, attribution
from attnserve.service.circuits.files import answer
from attnserve.service.circuits.graph import GraphOptions
from attnserve.service.circuits.plan import BACKWARD_BYTES, GraphPlan, plan_graph
from attnserve.service.circuits.top_logits import check_top_logits
from attnserve.service.core.backend import Backend, WeightsInfo
from attnserve.service.core.batching import SequenceResult
from attnserve.service.core.budget import ByteBudget, request_bytes
from attnserve.service.core.engine import Engine
from attnserve.service.core.errors import DeadlineExceededError, NotReadyError, UnsupportedError
from attnserve.service.core.memory import give_back_memory
from attnserve.service.core.metrics import ModelMetrics
from attnserve.service.core.plan import EncodePlan, check_response_size, plan_request
from attnserve.service.core.readouts import DECODE
from attnserve.service.core.request import EncodeOptions, GenerateOptions, Input
from attnserve.service.core.view import ModelView
from attnserve.service.generate.chat import ChatTemplate
from attnserve.service.generate.output import Token, detokenized, interleaved
from attnserve.service.generate.plan import GenerationPlan, generation_bytes, plan_generation

log = logging.getLogger(__name__)

# Give memory back once the server has been idle (release_after_idle_s) after at least this
# much work came and went (not after every request: the next one would pay to fault it in
# again, about a second per GiB on a virtual machine).
TRIM_AFTER_BYTES = 256 * 1024 * 1024
# How often a served model's directory is looked at for SAEs added (`attnserve sae add`).
SAE_WATCH_S = 2.0
# An attribution graph's backward pass: its rows' gradients, ONNX Runtime's copy as it
# computes them, and their effects
BACKWARD_WORK_BYTES = 3 * BACKWARD_BYTES
WARMING_UP = "the model is warming up; retry shortly"
SHUTTING_DOWN = "the server is shutting down; retry on another replica"


class DataPlane:
    """One served model version: its backend, engine and tokenizer, admission and drain."""

    def __init__(
        self,
        name: str,
        version: str,
        backend: Backend,
        engine: Engine,
        tokenizer: Tokenizer,
        metrics: ModelMetrics,
        budget: ByteBudget,
        max_message_bytes: int,
        release_memory: bool = True,
        release_after_idle_s: float = 10.0,
        weights: WeightsInfo | None = None,
        chat: ChatTemplate | None = None,
    ) -> None:
        self.name = name  # as the APIs name it: the repository's folder, or the config's name
        self.version = version  # the repository's version folder; "1" for --model
        self.backend = backend
        self.engine = engine
        self.metrics = metrics
        self.budget = budget  # the process's: every model's requests count in it
        self.max_message_bytes = max_message_bytes
        self.release_memory = release_memory
        self.release_after_idle_s = release_after_idle_s
        self.weights = weights or WeightsInfo()  # what GetModelInfo reports of them
        self.chat = chat  # the checkpoint's chat template, where it had one
        self.view = self._viewed(tokenizer)  # what requests are planned against
        self._released_since_trim = 0
        self._release_timer: asyncio.TimerHandle | None = None
        self._releasing: asyncio.Future[None] | None = None
        # Why new work is refused (UNAVAILABLE), or None while serving.
        self.refusal: str | None = WARMING_UP
        self._in_flight = 0  # requests between admission and answer
        self.graphs = 0  # attribution graphs between admission and answer
        self.last_call = 0.0  # time.monotonic() of the last request, admitted or refused
        self._idle = asyncio.Event()
        self._idle.set()
        self._watching: asyncio.Task[None] | None = None
        # Gauges read the state when scraped: nothing to update per request.
        metrics.in_flight.set_function(lambda: self._in_flight)

    def matches(self, version: str) -> bool:
        """Whether a request's version names this one ("": any; the weights' hash too)."""
        return version in ("", self.version, self.view.version)

    async def start(self) -> None:
        """Start the engine, warm every backend up, then let requests in."""
        self.engine.start()
        await self.engine.warm_up()
        if self.release_memory:  # what loading and warming up freed (0.3 GiB for TinyLlama),
            await asyncio.to_thread(give_back_memory)  # off the loop: other models may serve
        self.refusal = None
        self._watching = asyncio.create_task(self._watch_saes(), name=f"saes of {self.name}")

    async def _watch_saes(self) -> None:
        """Serve SAEs added to the directory while it is served, without a restart (opened
        off the loop: requests go on meanwhile)."""
        while True:
            await asyncio.sleep(SAE_WATCH_S)
            try:
                if await asyncio.to_thread(self.backend.refresh_saes):
                    self.view = self._viewed(self.tokenizer)
            except Exception:  # what it cannot open it logs; the model serves on regardless
                log.exception("%s: looking for new SAEs failed", self.name)

    def start_draining(self) -> None:
        self.refusal = SHUTTING_DOWN

    async def stop(self) -> None:
        """Finish what was admitted, then stop the engine and its workers."""
        self._cancel_release()
        if self._watching is not None:
            self._watching.cancel()
        await self.engine.stop(SHUTTING_DOWN)

    async def stop_generating(self) -> None:
        """End the texts being generated, each with NotReadyError (the server is stopping):
        their streams then end as their protocol ends a failure, not cut."""
        self.engine.stop_generating(SHUTTING_DOWN)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is in flight (draining); False if `timeout` ran out first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    @contextlib.asynccontextmanager
    async def results(
        self,
        inputs: Sequence[Input],
        options: EncodeOptions,
        timeout: float | None = None,
        by_layer: bool = False,
    ) -> AsyncIterator[tuple[EncodePlan, list[SequenceResult]]]:
        """Refuse or admit, plan and run a request (texts or numpy ids, and its options);
        yields the plan and each sequence's arrays, which stay counted in the memory budget
        until the caller has built its answer from them (attnserve.v1's EncodeResponse, the
        Open Inference Protocol's outputs, OpenAI's vectors). `by_layer`: the answer goes out as
        EncodeLayers' messages (only the largest must fit in one)."""
        with self._admitted():
            view = self.view
            config = view.config
            plan = plan_request(inputs, options, view)
            check_response_size(plan, config, self.max_message_bytes, by_layer)
            deadline = None if timeout is None else time.monotonic() + timeout
            async with self._room(request_bytes(plan, config), timeout):
                left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                try:  # gRPC cancels a call at its deadline; this does it for every transport
                    async with asyncio.timeout(left):
                        results = await self.engine.encode(plan.sequences, plan.selections, left)
                except TimeoutError:
                    raise DeadlineExceededError(
                        f"the deadline ({timeout:g} s) passed before the answer was ready"
                    ) from None
                yield plan, results

    @contextlib.asynccontextmanager
    async def generating(
        self, choices: Sequence[tuple[Input, GenerateOptions]], timeout: float | None = None
    ) -> AsyncIterator[tuple[list[int], AsyncIterator[tuple[int, Token]]]]:
        """Refuse or admit, plan and start the generation of some texts (each an input and
        its options: OpenAI's choices); yields each prompt's length in tokens, and their
        tokens as (choice, token) as they are made, the choices' interleaved. `timeout`
        bounds the wait for room in the memory budget (their KV caches), not the
        generation: a client stops it by going away."""
        view = self.view
        with self._admitted():
            if DECODE not in view.graphs:
                raise UnsupportedError(
                    f"{view.config.name} has no decode graph to generate with in "
                    f"{view.precision}: it comes with the graphs of a directory exported "
                    "by this version from a model with an unembedding (re-export it)"
                )
            plans = [plan_generation(item, options, view) for item, options in choices]
            reserved = sum(generation_bytes(plan, view.config) for plan in plans)
            async with self._room(reserved, timeout), contextlib.AsyncExitStack() as stack:
                streams = [
                    await stack.enter_async_context(contextlib.aclosing(self._tokens(plan)))
                    for plan in plans
                ]
                yield [len(plan.prompt) for plan in plans], interleaved(streams)

    @contextlib.asynccontextmanager
    async def graphing(
        self,
        item: Input,
        transcoders: str,
        options: GraphOptions,
        timeout: float | None = None,
        top_logits: int = 0,
    ) -> AsyncIterator[tuple[GraphPlan, AsyncIterator[Done | Attribution]]]:
        """Refuse or admit, plan and start an attribution graph of a prompt with the
        transcoder set `transcoders`; yields the plan and the graph's progress (Done after
        each backward pass), then the graph, as the engine runs it between other work.
        Leaving stops it; what it holds stays in the memory budget until then. `timeout`
        bounds each wait for room (its backward passes', then its matrices'). `top_logits`:
        each kept feature's that many (circuits/top_logits.py, the job's last steps)."""
        check_top_logits(top_logits)
        with self._admitted(), self._graph():
            view = self.view
            plan = plan_graph(item, transcoders, options, view, self.transcoder_sets)
            model = self.backend.replacement(transcoders)
            job = attribution(model, plan, view.config.logit_scale, top_logits)
            room = self._room(BACKWARD_WORK_BYTES, timeout)
            async with room, contextlib.AsyncExitStack() as held:
                progress = self.engine.run_steps(job)
                held.push_async_callback(progress.aclose)
                yield plan, self._held(progress, held, timeout)

    def graph_answer(
        self, done: Attribution, slug: str = "graph", include_adjacency: bool = False
    ) -> dict[str, Any]:
        """What every API answers of a finished graph (circuits/files.py answer), its
        tokens written with the special ones."""

        def decode(ids: list[int]) -> str:
            return self.tokenizer.decode(ids, special=True)

        return answer(done, decode, slug, include_adjacency, self.max_message_bytes)

    async def _held(
        self, progress: AsyncIterator[Any], held: contextlib.AsyncExitStack, timeout: float | None
    ) -> AsyncGenerator[Done | Attribution, None]:
        """A graph's steps, the room its first says its matrices need taken before the next."""
        async for step in progress:
            if step is None:  # a step with nothing to tell (a block of top logits)
                continue
            if isinstance(step, Done) and step.held_bytes:
                await held.enter_async_context(self._room(step.held_bytes, timeout))
            yield step

    async def _tokens(self, plan: GenerationPlan) -> AsyncGenerator[Token, None]:
        """One text's tokens: the engine's choices through the output processor."""
        async with contextlib.aclosing(self.engine.generate(plan)) as made:
            async for token in detokenized(made, plan, self.tokenizer):
                yield token

    @property
    def transcoder_sets(self) -> Sequence[str]:
        """The transcoder sets graphs can be computed with, as the directory holds them now."""
        return self.backend.transcoder_sets

    @contextlib.contextmanager
    def _graph(self) -> Iterator[None]:
        self.graphs += 1
        try:
            yield
        finally:
            self.graphs -= 1

    @contextlib.contextmanager
    def _admitted(self) -> Iterator[None]:
        """A request between admission and answer (or a refusal while not serving): what
        draining waits for."""
        self.last_call = time.monotonic()
        if self.refusal:
            raise NotReadyError(self.refusal)
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    @contextlib.asynccontextmanager
    async def _room(self, reserved: int, timeout: float | None) -> AsyncIterator[None]:
        """`reserved` bytes of the memory budget, waited for at most `timeout` seconds."""
        self._cancel_release()  # not idle after all
        await self.budget.acquire(reserved, timeout)
        try:
            yield
        finally:
            self._give_back(reserved)

    def _direction(self, sae: str, feature: int) -> np.ndarray:
        return self.backend.feature_direction(sae, feature)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.view.tokenizer

    def _viewed(self, tokenizer: Tokenizer) -> ModelView:
        """The backend as planners see it (its SAEs as they are now)."""
        b = self.backend
        return ModelView(
            b.config,
            tokenizer,
            b.graphs,
            dict(b.saes),
            self._direction,
            b.version,
            b.provider,
            b.precision,
            tuple(b.gradient_lengths),
        )

    def _give_back(self, reserved: int) -> None:
        """Return a request's room to the budget; after a burst, give memory back once idle."""
        self.budget.release(reserved)
        self._released_since_trim += reserved
        idle = self.budget.used == 0 and not self.budget.waiting
        if self.release_memory and idle and self._released_since_trim >= TRIM_AFTER_BYTES:
            self._cancel_release()
            loop = asyncio.get_running_loop()
            self._release_timer = loop.call_later(self.release_after_idle_s, self._release)

    def _cancel_release(self) -> None:
        if self._release_timer:
            self._release_timer.cancel()
            self._release_timer = None

    def _release(self) -> None:
        """A burst has ended: hand its freed buffers back to the OS."""
        self._release_timer = None
        self._released_since_trim = 0
        if self._releasing is None or self._releasing.done():
            self._releasing = asyncio.ensure_future(self.engine.release_memory())
