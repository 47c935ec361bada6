"""The FastAPI application: ``create_app()``; served by ``runlane serve``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runlane import __version__
from runlane.api import admin_routes, lanes_routes, ops_routes, runs_routes
from runlane.api.context import ApiContext
from runlane.api.errors import STATUS_BY_CODE, install_error_handlers
from runlane.api.limits import BodySizeLimit
from runlane.api.metrics import ApiMetrics
from runlane.collector import tune_collector
from runlane.database import create_pool
from runlane.event_hub import EventHub
from runlane.keys import KeyStore
from runlane.lane_service import LaneService
from runlane.lane_store import LaneStore
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import RunStore

DESCRIPTION = """
Durable runs for AI agents on PostgreSQL.

Authenticate with `Authorization: Bearer <api key>` (`runlane keys create`).
Errors are `{"error": {"code": "...", "message": "..."}}`; the code is
stable. Codes and statuses:

""" + "\n".join(f"- `{code}`: {status}" for code, status in sorted(STATUS_BY_CODE.items()))


def create_app(
    settings: Settings,
    url: str,
    *,
    agents: frozenset[str] | None = None,
    keepalive_seconds: float = 15.0,
    pool_size: int = 20,
) -> FastAPI:
    """The API over the (migrated) database at ``url``. With ``agents``,
    submissions for other agent names are refused with ``unknown_agent``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tune_collector(settings.gc_threshold)
        # Checkouts are checked without a round trip (a connection the
        # server closed while idle is replaced, not handed to a request).
        pool = create_pool(url, min_size=2, max_size=pool_size, check="quiet")
        await pool.open(wait=False)
        hub = EventHub(url, pool)
        runs = RunService(RunStore(pool), settings)
        context = ApiContext(
            settings=settings,
            url=url,
            pool=pool,
            runs=runs,
            lanes=LaneService(LaneStore(pool), runs),
            keys=KeyStore(pool, cache_seconds=settings.api_key_cache_seconds),
            hub=hub,
            metrics=ApiMetrics(lambda: hub.subscriber_count),
            agents=agents,
            keepalive_seconds=keepalive_seconds,
        )
        app.state.runlane = context
        await hub.start()
        try:
            yield
        finally:
            await hub.stop()
            await pool.close()

    app = FastAPI(
        title="runlane",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    install_error_handlers(app)
    routers = [lanes_routes.router, runs_routes.router, admin_routes.router, ops_routes.router]
    for router in routers:
        app.include_router(router)
    # For the Allow header of a 405: which methods each path template serves.
    app.state.route_methods = [
        (route.path_regex, route.methods)
        for router in routers
        for route in router.routes
        if isinstance(route, APIRoute)
    ]
    # The dashboard: static pages shipped in the package, over the /v1 API.
    ui = files("runlane") / "ui"
    if ui.is_dir():
        app.mount("/ui", StaticFiles(directory=str(ui), html=True), name="ui")
    app.add_middleware(RequestMetrics)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    return app


DOCUMENT_PATHS = frozenset({"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


class RequestMetrics:
    """Counts requests by route template (never by raw path) and status."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        first_byte: list[float] = []

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                first_byte.append(time.perf_counter())
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            app: Any = scope.get("app")
            context = getattr(getattr(app, "state", None), "runlane", None)
            if context is not None:
                route = getattr(scope.get("route"), "path", None) or (
                    scope["path"] if scope["path"] in DOCUMENT_PATHS else "unmatched"
                )
                context.metrics.requests.labels(
                    method=scope["method"], route=route, status=str(status)
                ).inc()
                elapsed = (first_byte[0] if first_byte else time.perf_counter()) - started
                context.metrics.latency.labels(route=route).observe(elapsed)
