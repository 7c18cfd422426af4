"""OpenAI's embeddings API: GET /v1/models and POST /v1/embeddings, as its SDK calls them
(`model` names a served model; left out, the default one)."""

from __future__ import annotations

import base64

from fastapi import APIRouter, Depends, Request

from attnserve.service.core.plan import pooled
from attnserve.service.core.request import EncodeOptions, Pooling
from attnserve.service.http.errors import ErrorRoute
from attnserve.service.http.state import authorized, deadline, state
from attnserve.service.openai.inputs import fitted
from attnserve.service.openai.protocol import EmbeddingsRequest
from attnserve.service.openai.translate import embedding_inputs

router = APIRouter(
    prefix="/v1", tags=["openai"], route_class=ErrorRoute, dependencies=[Depends(authorized)]
)


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
        config = dataplane.view.config
        inputs = embedding_inputs(body, config.embedding_dim)
        limit = (config.max_seq_len, f"max_seq_len={config.max_seq_len}")
        keep = body.truncate_prompt_tokens
        inputs = list(fitted("input", inputs, dataplane.tokenizer, keep, limit))
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
