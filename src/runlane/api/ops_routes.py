"""Operations: liveness, readiness, Prometheus metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from runlane.api.context import ApiContext
from runlane.api.errors import error_response
from runlane.api.schemas import Health
from runlane.migrations import pending_migrations

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health, summary="The process is up")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    summary="The database answers and its schema is current",
    responses={503: {"description": "Not ready."}},
)
async def readyz(request: Request) -> Response | Health:
    context: ApiContext = request.app.state.runlane
    try:
        async with asyncio.timeout(5):
            pending = await asyncio.to_thread(pending_migrations, context.url)
    except Exception as exc:  # any failure means "not ready"
        return error_response("database_unavailable", f"database unreachable: {exc}", 503)
    if pending:
        return error_response("database_unavailable", f"{len(pending)} migrations not applied", 503)
    return Health(status="ready")


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
async def metrics(request: Request) -> Response:
    context: ApiContext = request.app.state.runlane
    return Response(generate_latest(context.metrics.registry), media_type=CONTENT_TYPE_LATEST)
