"""attnserve.v1's Graph over one model's data plane: the request as circuit-tracer's
options, a GraphResponse of progress after each backward pass, then the graph's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from attnserve.service.circuits.attribute import Attribution, Done
from attnserve.service.circuits.graph import KNOBS, GraphOptions, graph_options
from attnserve.service.core.dataplane import DataPlane
from attnserve.service.v1.options import input_of
from attnserve.v1 import encoder_service_pb2 as pb


def options_of(request: pb.GraphRequest) -> GraphOptions:
    """circuit-tracer's arguments as set, its defaults where unset."""
    return graph_options({name: getattr(request, name) for name in KNOBS if request.HasField(name)})


async def graph(
    plane: DataPlane, request: pb.GraphRequest, timeout: float | None
) -> AsyncIterator[pb.GraphResponse]:
    """The graph's progress, then the graph; `timeout` bounds each wait for memory."""
    prompt = input_of("prompt", request.prompt)
    options, k = options_of(request), request.top_logits
    async with plane.graphing(prompt, request.transcoders, options, timeout, k) as (_, steps):
        async for step in steps:
            if isinstance(step, Done):
                progress = pb.GraphProgress(rows=step.rows, total=step.total)
                yield pb.GraphResponse(progress=progress)
            else:
                result = await asyncio.to_thread(_result, plane, step, request)
                yield pb.GraphResponse(result=result)


def _result(plane: DataPlane, done: Attribution, request: pb.GraphRequest) -> pb.GraphResult:
    slug, include = request.slug or "graph", request.include_adjacency
    made = plane.graph_answer(done, slug, include)
    adjacency = made.pop("adjacency", None)
    scores = made.pop("scores")
    return pb.GraphResult(
        graph_json=json.dumps(made),
        replacement_score=scores["replacement"],
        completeness_score=scores["completeness"],
        adjacency_json="" if adjacency is None else json.dumps(adjacency),
    )
