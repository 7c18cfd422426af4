"""The memory budget: its policy alone, then through a server whose model is held busy."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from attnserve.client import AsyncEncoderClient, ClientOptions
from attnserve.model.packing import packed_length
from attnserve.model.tokenizer import ByteTokenizer
from attnserve.service.core import dataplane
from attnserve.service.core.budget import ByteBudget, request_bytes
from attnserve.service.core.errors import DeadlineExceededError
from attnserve.service.core.plan import plan_request
from attnserve.service.core.request import AttentionOptions, EncodeOptions, Layout
from attnserve.service.core.view import ModelView
from tests.conftest import SMALL_CONFIG, ServerThread
from tests.service.fakes import FakeBackend


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_reservations_wait_for_room_in_arrival_order():
    async def scenario():
        budget = ByteBudget(100)
        await budget.acquire(60)
        large = asyncio.ensure_future(budget.acquire(50))
        small = asyncio.ensure_future(budget.acquire(10))  # would fit, but comes second
        await settle()
        waiting = (large.done(), small.done(), budget.waiting)
        budget.release(60)
        await asyncio.gather(large, small)
        return waiting, budget.used

    waiting, used = asyncio.run(scenario())
    assert waiting == (False, False, 2)
    assert used == 60


def test_a_request_larger_than_the_budget_runs_alone():
    async def scenario():
        budget = ByteBudget(100)
        await budget.acquire(500)  # an empty budget takes anything
        behind = asyncio.ensure_future(budget.acquire(1))
        await settle()
        alone = not behind.done()
        budget.release(500)
        await behind
        return alone, budget.used

    assert asyncio.run(scenario()) == (True, 1)


def test_a_deadline_while_waiting_leaves_the_line():
    async def scenario():
        budget = ByteBudget(100)
        await budget.acquire(100)
        with pytest.raises(DeadlineExceededError, match="--max-inflight-bytes"):
            await budget.acquire(10, timeout=0.01)
        cancelled = asyncio.ensure_future(budget.acquire(10))
        await settle()
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        left = budget.waiting
        budget.release(100)
        return left, budget.used

    assert asyncio.run(scenario()) == (0, 0)


def test_zero_means_no_budget():
    async def scenario():
        budget = ByteBudget(0)
        for _ in range(3):
            await budget.acquire(10**12)
        return budget.used

    assert asyncio.run(scenario()) == 3 * 10**12


def test_work_over_the_budget_waits_outside_the_queue_then_runs(small_model_dir, monkeypatch):
    """Budget 1 byte: every request is over it, so each runs alone, after the one before;
    once idle, the backend is asked to give memory back."""
    monkeypatch.setattr(dataplane, "TRIM_AFTER_BYTES", 1)
    backend = FakeBackend()
    server = ServerThread(small_model_dir, backend, max_inflight_bytes=1, release_after_idle_s=0)
    try:

        async def scenario():
            async with AsyncEncoderClient(server.address, ClientOptions(retries=0)) as client:
                backend.gate.clear()
                first = asyncio.ensure_future(client.encode([[1, 2]], attention=True))
                await asyncio.to_thread(backend.wait_calls, 1)
                second = asyncio.ensure_future(client.encode([[3, 4]], attention=True))
                while server.metric("attnserve_budget_waiting") < 1:
                    await asyncio.sleep(0.001)
                depth = server.running.engine.depth  # waiting for memory, not in the queue
                with pytest.raises(grpc.RpcError) as late:
                    await client.encode([[77]], timeout=0.2)
                backend.gate.set()
                answers = await asyncio.gather(first, second)
                return depth, late.value, answers

        depth, late, answers = asyncio.run(scenario())
        assert depth == 0
        assert late.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # (who says it first varies)
        assert [a[0].attention.shape for a in answers] == [(2, 2, 2, 2)] * 2
        assert backend.shapes() == [("attend", (1, 2)), ("attend", (1, 2))]  # never together
        assert not any((ids == 77).any() for _, ids in backend.calls)
        assert server.metric("attnserve_inflight_bytes") == 0
        assert backend.released.wait(30)
    finally:
        server.stop()


def test_a_packed_request_also_reserves_the_square_map_it_is_packed_from():
    """The reducer writes every row of the selected weights before packing them: the
    reservation holds that map beside the packed answer (and its serialized bytes)."""
    config, length = SMALL_CONFIG, 300
    tokenizer = ByteTokenizer(config)

    def reserved(layout: Layout) -> int:
        options = EncodeOptions(attention=AttentionOptions(float16=True, layout=layout))
        plan = plan_request([np.ones(length, np.int64)], options, ModelView(config, tokenizer))
        return request_bytes(plan, config)

    square = config.n_layers * config.n_heads * length * length * 2
    triangle = config.n_layers * config.n_heads * packed_length(length) * 2
    full, packed = reserved(Layout.FULL), reserved(Layout.CAUSAL_PACKED)
    assert packed == full - 2 * (square - triangle) + square
