"""Neuronpedia's inference API for feature activations: POST /v1/activation/topk-by-token,
/v1/activation/all and /v1/activation/single, request and response as its OpenAPI schema
says (what its published client, neuronpedia-inference-client, sends and reads), so a
self-hosted Neuronpedia can use attnserve as a CPU backend. The logic is in
service/neuronpedia/; refusals are `{"error": "..."}`, as Neuronpedia's server answers.
Its secret, where --auth-token is set, comes as the X-SECRET-KEY header (or as
`Authorization: Bearer`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from attnserve.service.core.auth import check_bearer
from attnserve.service.core.errors import InvalidInputError
from attnserve.service.http.errors import ErrorRoute
from attnserve.service.http.state import deadline, state
from attnserve.service.neuronpedia import activations

SECRET_HEADER = "x-secret-key"


def secret(request: Request) -> None:
    """With --auth-token set: Neuronpedia's X-SECRET-KEY header, or a bearer token."""
    token = state(request).settings.auth_token
    if token:
        given = request.headers.get(SECRET_HEADER)
        header = f"Bearer {given}" if given is not None else request.headers.get("authorization")
        check_bearer(header or "", token, "X-SECRET-KEY header")


router = APIRouter(
    prefix="/v1/activation",
    tags=["neuronpedia"],
    route_class=ErrorRoute,
    dependencies=[Depends(secret)],
)


class TopkByTokenRequest(BaseModel):
    prompt: str
    model: str = Field(description="a served model's name")
    source: str = Field(description="an SAE's name in the model directory (e.g. 6-res-jb)")
    top_k: int | None = Field(None, description="features per token (default 5)")
    ignore_bos: bool = False


class AllRequest(BaseModel):
    prompt: str
    model: str
    source_set: str = Field(description="the SAEs named LAYER-<source_set>")
    selected_sources: list[str] = Field(default_factory=list, description="empty: the set's")
    sort_by_token_indexes: list[int] = Field(default_factory=list)
    ignore_bos: bool = False
    num_results: int | None = 25


class SingleRequest(BaseModel):
    prompt: str
    model: str
    source: str | None = None
    index: str | None = None
    vector: list[float] | None = None
    hook: str | None = None


@router.post("/topk-by-token")
async def topk_by_token(body: TopkByTokenRequest, request: Request) -> dict:
    """Each token's strongest features of one SAE."""
    with state(request).repository.observed("POST /v1/activation/topk-by-token") as find:
        plane = find(body.model)
        return await activations.topk_by_token(
            plane, body.prompt, body.source, body.top_k, body.ignore_bos, deadline(request)
        )


@router.post("/all")
async def all_features(body: AllRequest, request: Request) -> dict:
    """The features of a source set that fire most on the prompt, at every token."""
    with state(request).repository.observed("POST /v1/activation/all") as find:
        plane = find(body.model)
        return await activations.all_features(
            plane,
            body.prompt,
            body.source_set,
            body.selected_sources,
            body.sort_by_token_indexes,
            body.ignore_bos,
            body.num_results,
            deadline(request),
        )


@router.post("/single")
async def single(body: SingleRequest, request: Request) -> dict:
    """One feature's activation at every token (a source and an index; custom vectors are
    not served)."""
    with state(request).repository.observed("POST /v1/activation/single") as find:
        plane = find(body.model)
        if body.source is None or body.index is None:
            raise InvalidInputError(
                "source and index: both are needed (a custom vector and hook are not served)"
            )
        return await activations.single(
            plane, body.prompt, body.source, body.index, deadline(request)
        )
