"""Operator endpoints: `/health` and Prometheus `/metrics` (no API key for either)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from aenv.api.models import Health
from aenv.obs import SANDBOXES
from aenv.orchestrator.states import SandboxState

router = APIRouter()


@router.get("/health", operation_id="health")
async def health() -> Health:
    return Health(status="ok")


@router.get("/metrics", operation_id="prometheusMetrics", response_class=Response)
async def prometheus(request: Request) -> Response:
    counts = request.app.state.orchestrator.stats()
    for s in SandboxState:
        SANDBOXES.labels(str(s)).set(counts.get(s, 0))
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
