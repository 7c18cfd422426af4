"""The HTTP app: OpenAI-compatible embeddings and completions, the JSON mirror of Encode,
attribution graphs, Neuronpedia's activation endpoints and graph server, the Open
Inference Protocol's /v2, health, the explorer and the API docs, over the one data plane.

Each API is a module-level router (openai.py, completions.py, encode.py, graph.py,
neuronpedia.py, neuronpedia_graph.py, oip.py, health.py)
whose routes take the models from the app's state (state.py) and raise the service's typed
errors; errors.py answers them in the API's shape with the status of the one table.
"""

from __future__ import annotations

import time
from importlib import metadata

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from attnserve.service.core.repository import ModelRepository
from attnserve.service.http import (
    completions,
    encode,
    graph,
    health,
    neuronpedia,
    neuronpedia_graph,
    oip,
    openai,
)
from attnserve.service.http.errors import BodyLimit, add_error_handlers
from attnserve.service.http.pages import add_pages
from attnserve.service.http.state import AppState
from attnserve.service.oip.model import OipProtocol
from attnserve.service.settings import Settings


def create_app(
    repository: ModelRepository, settings: Settings, oip_protocol: OipProtocol
) -> FastAPI:
    """The HTTP app over the served models; `oip_protocol` is shared with the gRPC transport."""
    app = FastAPI(
        title="attnserve",
        description="Contextual embeddings and attention weights of a causal self-attention "
        "encoder. The same model and batcher as the gRPC API (attnserve.v1.EncoderService).",
        version=metadata.version("attnserve"),
        docs_url=None,  # FastAPI's pages load Swagger UI and ReDoc from a CDN: see pages.py
        redoc_url=None,
    )
    app.state.attnserve = AppState(repository, settings, oip_protocol, int(time.time()))
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type"],
        )
    app.add_middleware(BodyLimit, limit=settings.max_message_bytes)
    add_error_handlers(app)
    for module in (health, openai, completions, encode, graph, neuronpedia, neuronpedia_graph, oip):
        app.include_router(module.router)
    add_pages(app)
    return app
