"""attnserve.v1's Graph over one model's data plane: the request as circuit-tracer's
options, a GraphResponse of progress after each backward pass, then the graph's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from attnserve.model.tokenizer import Tokenizer
from attnserve.service.circuits.attribute import Attribution, Done
from attnserve.service.circuits.files import answer
from attnserve.service.circuits.graph import GraphOptions
from attnserve.service.core.dataplane import DataPlane
from attnserve.service.v1.options import input_of
from attnserve.v1 import encoder_service_pb2 as pb

DEFAULTS = GraphOptions()
_KNOBS = (
    "max_n_logits",
    "desired_logit_prob",
    "max_feature_nodes",
    "batch_size",
    "update_interval",
    "node_threshold",
    "edge_threshold",
)


def options_of(request: pb.GraphRequest) -> GraphOptions:
    """circuit-tracer's arguments as set, its defaults where unset."""
    return GraphOptions(
        **{
            name: getattr(request, name) if request.HasField(name) else getattr(DEFAULTS, name)
            for name in _KNOBS
        }
    )


async def graph(
    plane: DataPlane, request: pb.GraphRequest, timeout: float | None
) -> AsyncIterator[pb.GraphResponse]:
    """The graph's progress, then the graph; `timeout` bounds each wait for memory."""
    prompt = input_of("prompt", request.prompt)
    started = plane.graphing(prompt, request.transcoders, options_of(request), timeout)
    async with started as (_, steps):
        async for step in steps:
            if isinstance(step, Done):
                progress = pb.GraphProgress(rows=step.rows, total=step.total)
                yield pb.GraphResponse(progress=progress)
            else:
                limit, tokenizer = plane.max_message_bytes, plane.tokenizer
                result = await asyncio.to_thread(_result, step, request, tokenizer, limit)
                yield pb.GraphResponse(result=result)


def _result(
    done: Attribution, request: pb.GraphRequest, tokenizer: Tokenizer, max_bytes: int
) -> pb.GraphResult:
    made = answer(
        done,
        lambda ids: tokenizer.decode(ids, special=True),
        request.slug or "graph",
        request.include_adjacency,
        max_bytes,
    )
    adjacency = made.pop("adjacency", None)
    scores = made.pop("scores")
    return pb.GraphResult(
        graph_json=json.dumps(made),
        replacement_score=scores["replacement"],
        completeness_score=scores["completeness"],
        adjacency_json="" if adjacency is None else json.dumps(adjacency),
    )
