"""Long jobs on the engine (an attribution graph's backward passes: Engine.run_steps), with
the fake backend and gated steps: each step runs when its caller asks for it, on the wide
lane, with Encodes between steps; a caller that leaves closes its job (after the step that
is running, never inside it); a step's failure is its caller's alone; stopping the engine
fails the steps still waiting."""

from __future__ import annotations

import asyncio
import threading

import pytest

from attnserve.service.core.errors import InferenceError, NotReadyError
from tests.service.core.test_engine import Scenario, ids, run


class Job:
    """A job of `n` steps, each held inside the lane by `gate` while it is cleared; what ran
    and in which order goes to `log` (shared with the backend's calls' order)."""

    def __init__(self, n: int, log: list[str], fail_at: int | None = None) -> None:
        self.n, self.log, self.fail_at = n, log, fail_at
        self.gate = threading.Event()
        self.gate.set()
        self.closed = threading.Event()
        self.threads: list[str] = []  # each started step's thread
        self._started = threading.Condition()

    def wait_started(self, n: int) -> None:
        """Block until `n` steps have begun (the last may be held by the gate)."""
        with self._started:
            if not self._started.wait_for(lambda: len(self.threads) >= n, 30):
                raise TimeoutError(f"{len(self.threads)} steps began, expected {n}")

    def steps(self):
        try:
            for i in range(self.n):
                with self._started:
                    self.threads.append(threading.current_thread().name)
                    self._started.notify_all()
                self.gate.wait()
                if i == self.fail_at:
                    raise RuntimeError("a bug in step 1")
                self.log.append(f"step {i}")
                yield i
            return "done"
        finally:
            self.closed.set()


def test_a_job_runs_step_by_step_between_encodes_on_the_wide_lane():
    async def scenario():
        s = Scenario()
        order: list[str] = []
        job = Job(3, order)
        got = []
        job.gate.clear()
        consumer = asyncio.ensure_future(_consume(s.engine.run_steps(job.steps()), got))
        await asyncio.to_thread(job.wait_started, 1)  # step 0 is inside the lane
        encode = s.queue(ids(4))
        await s.settle()
        job.gate.set()
        await encode
        order.append("encode")
        await consumer
        return got, order, job.threads, s.backend.threads

    got, order, job_threads, encode_threads = run(scenario)
    assert got == [0, 1, 2, "done"]
    # the Encode that came during step 0 ran before step 1 (it waited for one step only)
    assert order.index("encode") < order.index("step 2")
    assert set(job_threads) == {encode_threads[0]}  # the wide lane's thread


async def _consume(steps, got: list) -> None:
    async for answer in steps:
        got.append(answer)


def test_leaving_mid_step_closes_the_job_after_that_step():
    async def scenario():
        s = Scenario()
        job = Job(5, [])
        got: list = []
        job.gate.clear()
        consumer = asyncio.ensure_future(_consume(s.engine.run_steps(job.steps()), got))
        await asyncio.to_thread(job.wait_started, 1)
        job.gate.set()  # step 0 ends; step 1 is held inside the lane
        job.gate.clear()
        await asyncio.to_thread(job.wait_started, 2)
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        assert not job.closed.is_set()  # not while its step runs
        job.gate.set()
        await asyncio.to_thread(job.closed.wait, 30)
        after = await s.engine.encode([ids(3)])  # the engine serves on
        return job.closed.is_set(), len(after)

    closed, answered = run(scenario)
    assert closed and answered == 1


def test_a_failing_step_fails_its_caller_only():
    async def scenario():
        s = Scenario()
        job = Job(3, [], fail_at=1)
        got: list = []
        with pytest.raises(InferenceError, match="a bug in step 1"):
            await _consume(s.engine.run_steps(job.steps()), got)
        return got, job.closed.is_set(), len(await s.engine.encode([ids(2)]))

    assert run(scenario) == ([0], True, 1)


def test_stopping_the_engine_fails_the_steps_waiting():
    async def scenario():
        s = Scenario()
        blocker = await s.hold()  # the wide lane is busy: the step waits
        job = Job(2, [])
        consumer = asyncio.ensure_future(_consume(s.engine.run_steps(job.steps()), []))
        await s.settle()
        stopping = asyncio.ensure_future(s.engine.stop("going away"))
        await s.settle()
        s.release()
        await blocker
        with pytest.raises(NotReadyError, match="going away"):
            await consumer
        await stopping
        return job.threads

    assert run(scenario) == []  # it never ran
