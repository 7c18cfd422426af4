"""Attribution graphs over HTTP: POST /v1/graph takes a prompt, a transcoder set and
circuit-tracer's own argument names, and answers circuit-tracer's graph file (its viewer
and Neuronpedia load it as it is) with the graph's scores, or, streamed, a line of progress
after each backward pass and the answer last (NDJSON)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from attnserve.service.circuits.attribute import Attribution, Done
from attnserve.service.circuits.graph import GraphOptions, graph_options
from attnserve.service.core.dataplane import DataPlane
from attnserve.service.core.status import log_unexpected
from attnserve.service.http.errors import ErrorRoute, error_response
from attnserve.service.http.state import authorized, deadline, state
from attnserve.service.openai.protocol import RequestBody

router = APIRouter(
    prefix="/v1", tags=["attnserve"], route_class=ErrorRoute, dependencies=[Depends(authorized)]
)
DEFAULTS = GraphOptions()
ROUTE = "POST /v1/graph"


class GraphBody(RequestBody):
    """A graph request: what to attribute, with which transcoders, and circuit-tracer
    0.5.0's attribute() and create_graph_files() arguments, its defaults."""

    model: str = ""
    prompt: str | list[int] = Field(
        description="a text, or its token ids; a special token is put first unless it "
        "starts with one (its position holds no features)"
    )
    transcoders: str = Field(description="a transcoder set added with `attnserve sae add`")
    max_n_logits: int = DEFAULTS.max_n_logits
    desired_logit_prob: float = DEFAULTS.desired_logit_prob
    max_feature_nodes: int | None = DEFAULTS.max_feature_nodes
    batch_size: int = DEFAULTS.batch_size
    update_interval: int = DEFAULTS.update_interval
    node_threshold: float = DEFAULTS.node_threshold
    edge_threshold: float = DEFAULTS.edge_threshold
    slug: str = Field("graph", description="the graph's name in its metadata")
    include_adjacency: bool = Field(
        False, description="also the unpruned graph, under circuit-tracer's Graph names"
    )
    stream: bool = Field(False, description="NDJSON: progress lines, then the answer")

    top_logits: int = Field(
        0,
        description="each feature's tokens its decoder row raises most, as `feature_logits` "
        "by jsNodeId (at most 32)",
    )

    def options(self) -> GraphOptions:
        return graph_options(self.model_dump())


@router.post("/graph", response_model=None)
async def graph(body: GraphBody, request: Request) -> dict | StreamingResponse:
    """circuit-tracer's attribution graph of the prompt: its graph file's fields
    (`metadata`, `qParams`, `nodes`, `links`), `scores` (replacement, completeness) and
    with `include_adjacency` the unpruned graph as `adjacency`."""
    with state(request).repository.observed(ROUTE) as find:
        plane = find(body.model)
        stack = contextlib.AsyncExitStack()
        item = body.prompt if isinstance(body.prompt, str) else np.asarray(body.prompt, np.int64)
        _, steps = await stack.enter_async_context(
            plane.graphing(
                item, body.transcoders, body.options(), deadline(request), body.top_logits
            )
        )
        if body.stream:
            lines = _lines(stack, steps, plane, body)
            return StreamingResponse(lines, media_type="application/x-ndjson")
        async with stack:
            async for step in steps:
                if isinstance(step, Attribution):
                    return await asyncio.to_thread(answer, plane, body, step)
                if await request.is_disconnected():
                    break
        return {}  # the client went away: no one reads it


async def _lines(
    stack: contextlib.AsyncExitStack,
    steps: AsyncIterator[Done | Attribution],
    plane: DataPlane,
    body: GraphBody,
) -> AsyncIterator[str]:
    """{"progress": {"rows", "total"}} after each backward pass, then the answer; a failure
    after the first line is a line of the error's shape."""
    async with stack:
        try:
            async for step in steps:
                if isinstance(step, Done):
                    progress = {"rows": step.rows, "total": step.total}
                    yield json.dumps({"progress": progress}) + "\n"
                else:
                    yield json.dumps(await asyncio.to_thread(answer, plane, body, step)) + "\n"
        except Exception as exc:
            log_unexpected(ROUTE, exc)
            yield bytes(error_response("/v1/graph", exc).body).decode() + "\n"


def answer(plane: DataPlane, body: GraphBody, done: Attribution) -> dict:
    return plane.graph_answer(done, body.slug, body.include_adjacency)
