"""Health for probes (no token needed): GET /health (ready) and GET /health/live."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from attnserve.service.http.state import state

router = APIRouter(prefix="/health", tags=["health"])


@router.get("")
async def ready(request: Request) -> JSONResponse:
    """Readiness: 200 SERVING once every model is warm; 503 NOT_SERVING before and while
    draining (the states of the gRPC health service)."""
    reason = state(request).repository.unready_reason
    if reason is not None:
        return JSONResponse({"status": "NOT_SERVING", "reason": reason}, 503)
    return JSONResponse({"status": "SERVING"})


@router.get("/live")
async def live() -> dict:
    """Liveness: 200 while the process answers at all."""
    return {"status": "ALIVE"}
