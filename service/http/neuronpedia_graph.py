"""Neuronpedia's graph server (apps/graph: what its webapp's `+ New Graph` calls, circuit-tracer
behind it): POST /generate-graph, its request's fields and its answer, circuit-tracer's graph
file, computed here (service/circuits) with the model's transcoder set; GET /check-busy.
Its secret, where --auth-token is set, comes as the X-SECRET-KEY header (or as
`Authorization: Bearer`); refusals are `{"error": "..."}`.

Where its server holds one model and one set and refuses a second request while busy (503),
this one queues graphs beside its other work; `model_id` names a served model, and the
model's one transcoder set is used (a model with several names them in the refusal).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from attnserve.service.circuits.attribute import Attribution
from attnserve.service.circuits.files import graph_file
from attnserve.service.circuits.graph import GraphOptions, graph_options
from attnserve.service.core.dataplane import DataPlane
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.http.errors import ErrorRoute
from attnserve.service.http.neuronpedia import secret
from attnserve.service.http.state import deadline, state

router = APIRouter(tags=["neuronpedia"], route_class=ErrorRoute, dependencies=[Depends(secret)])
ROUTE = "POST /generate-graph"


class GraphGenerationRequest(BaseModel):
    """Neuronpedia's graph server's request, its fields and defaults."""

    model_config = ConfigDict(extra="forbid")

    prompt: str
    model_id: str = Field(description="a served model's name")
    batch_size: int = 48
    max_n_logits: int = 10
    desired_logit_prob: float = 0.95
    node_threshold: float = 0.8
    edge_threshold: float = 0.98
    slug_identifier: str
    max_feature_nodes: int = 10000
    signed_url: str | None = Field(None, description="refused: the graph comes in the answer")
    user_id: str | None = None
    compress: bool = False

    def options(self) -> GraphOptions:
        return graph_options(self.model_dump())


@router.post("/generate-graph")
async def generate_graph(body: GraphGenerationRequest, request: Request) -> dict:
    """circuit-tracer's graph file of the prompt, as Neuronpedia's graph server answers it."""
    if body.signed_url is not None:
        raise InvalidInputError(
            "signed_url: uploading to storage is not done here; ask without it for the "
            "graph in the answer"
        )
    with state(request).repository.observed(ROUTE) as find:
        plane = find(body.model_id)
        sets = list(plane.transcoder_sets)
        if len(sets) != 1:
            held = ", ".join(sets) or "none"
            raise InvalidInputError(
                f"model_id: {plane.name} has {len(sets)} transcoder sets ({held}); its "
                "graph server's requests name none, so it needs exactly one (POST /v1/graph "
                "names one)"
            )
        started = plane.graphing(body.prompt, sets[0], body.options(), deadline(request))
        async with started as (_, steps):
            async for step in steps:
                if isinstance(step, Attribution):
                    return await asyncio.to_thread(_answer, plane, body, step)
    raise AssertionError("the graph's steps ended without the graph")


def _answer(plane: DataPlane, body: GraphGenerationRequest, done: Attribution) -> dict:
    tokenizer = plane.tokenizer
    return graph_file(
        done.graph,
        done.pruned,
        lambda ids: tokenizer.decode(ids, special=True),
        body.slug_identifier,
        done.scan,
        body.node_threshold,
    )


@router.get("/check-busy")
async def check_busy(request: Request, model_id: str = "") -> dict:
    """{"busy": whether a graph is being computed}; a graph asked for now waits its turn."""
    with state(request).repository.observed("GET /check-busy") as find:
        return {"busy": find(model_id).graphs > 0}
