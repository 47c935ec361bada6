"""Serving the HTTP API in a test: uvicorn on a free port, real HTTP."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from runlane.api import create_app
from runlane.keys import KeyStore
from runlane.settings import Settings
from tests.support import wait_until


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ApiServer:
    base_url: str
    server: uvicorn.Server

    @property
    def context(self) -> Any:
        return self.server.config.loaded_app.app.state.runlane  # type: ignore[attr-defined]

    def client(self, key: str | None = None, **kwargs: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=30, **kwargs)


@asynccontextmanager
async def serve_api(settings: Settings, **app_kwargs: Any) -> AsyncIterator[ApiServer]:
    assert settings.database_url is not None
    app = create_app(settings, settings.database_url, **app_kwargs)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await wait_until(lambda: server.started, timeout=15, message="uvicorn started")
        yield ApiServer(f"http://127.0.0.1:{port}", server)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


async def create_key(keys: KeyStore, tenant: str, user: str, *, admin: bool = False) -> str:
    _, secret = await keys.create(tenant=tenant, user_id=user, admin=admin)
    return secret
