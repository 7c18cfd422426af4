"""OpenAI's embeddings API: GET /v1/models and POST /v1/embeddings, as its SDK calls them
(`model` names a served model; left out, the default one)."""

from __future__ import annotations

import base64
from typing import Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from attnserve.service.core.errors import InvalidInputError
from attnserve.service.core.plan import pooled
from attnserve.service.core.request import EncodeOptions, Input, Pooling
from attnserve.service.http.errors import ErrorRoute
from attnserve.service.http.openai_inputs import openai_inputs
from attnserve.service.http.state import authorized, deadline, state

router = APIRouter(
    prefix="/v1", tags=["openai"], route_class=ErrorRoute, dependencies=[Depends(authorized)]
)


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request, as its official SDK sends it."""

    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="a text, a list of texts, a token array or a list of token arrays"
    )
    model: str | None = Field(None, description="the served model's name (GET /v1/models)")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, description="if given, the model's embedding width")
    user: str | None = None


@router.get("/models")
async def models(request: Request) -> dict:
    """The served models, as OpenAI's model list."""
    s = state(request)
    data = [
        {"id": name, "object": "model", "created": s.started, "owned_by": "attnserve"}
        for name in sorted(s.repository.served)
    ]
    return {"object": "list", "data": data}


@router.post("/embeddings")
async def embeddings(body: EmbeddingsRequest, request: Request) -> dict:
    """One vector per input: the `--embeddings-pooling` of its token embeddings (default
    `last`: in a causal model only the last token has seen the whole input)."""
    s = state(request)
    with s.repository.observed("POST /v1/embeddings") as find:
        dataplane = find(body.model or "")
        config = dataplane.backend.config
        inputs = _inputs(body, config.embedding_dim)
        options = EncodeOptions(
            pooling=Pooling(s.settings.embeddings_pooling), token_embeddings=False
        )
        data = []
        async with dataplane.results(inputs, options, deadline(request)) as (plan, results):
            for index, result in enumerate(results):
                vector = pooled(result.embeddings, plan.pooling)
                embedding = (
                    base64.b64encode(vector.astype("<f4").tobytes()).decode()
                    if body.encoding_format == "base64"
                    else vector.tolist()
                )
                data.append({"object": "embedding", "index": index, "embedding": embedding})
            tokens = sum(len(ids) for ids in plan.sequences)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return {"object": "list", "data": data, "model": dataplane.name, "usage": usage}


def _inputs(body: EmbeddingsRequest, d_model: int) -> list[Input]:
    if body.dimensions is not None and body.dimensions != d_model:
        raise InvalidInputError(
            f"dimensions: this model's embeddings have {d_model} dimensions, "
            f"{body.dimensions} were asked for"
        )
    return openai_inputs("input", body.input)
