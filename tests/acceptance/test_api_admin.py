"""The admin routes: tenant cap, workers alive, queue overview."""

from __future__ import annotations

import asyncio
from typing import Any

from runlane import App, RunContext
from runlane.keys import KeyStore
from runlane.operations import Operations
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import RunStore
from tests.api_support import create_key, serve_api
from tests.support import running_worker, wait_until


async def test_admin_routes_show_caps_workers_and_queues(
    service: RunService, store: RunStore, settings: Settings
) -> None:
    keys = KeyStore(store.pool)
    admin = await create_key(keys, "acme", "root", admin=True)
    user = await create_key(keys, "acme", "ann")
    other_admin = await create_key(keys, "globex", "root", admin=True)
    await Operations(service).set_tenant_cap("acme", 4)
    app = App(settings)
    started = asyncio.Event()
    release = asyncio.Event()

    @app.agent("hold")
    async def hold(ctx: RunContext) -> Any:
        started.set()
        await release.wait()
        return None

    held, _ = await service.submit("hold", {}, tenant="acme", user_id="ann")
    await service.submit("queued-only", {}, tenant="acme")
    async with serve_api(settings) as api, running_worker(app, settings):
        await asyncio.wait_for(started.wait(), 10)
        async with api.client(admin) as client:
            tenant = (await client.get("/v1/admin/tenant")).json()
            assert tenant == {"tenant": "acme", "max_running": 4, "running": 1}

            async def workers() -> Any:
                rows = (await client.get("/v1/admin/workers")).json()
                return [w for w in rows if w["alive"] and w["run_ids"]]

            alive = await wait_until(workers, message="a worker holding the run")
            assert alive[0]["run_ids"] == [str(held.id)] and alive[0]["agents"] == ["hold"]
            view = (await client.get("/v1/admin/overview")).json()
            assert {(r["status"], r["agent"]) for r in view["live"]} == {
                ("running", "hold"),
                ("pending", "queued-only"),
            }
            assert view["dead"] == 0 and view["oldest_pending_seconds"] is not None
        async with api.client(other_admin) as client:
            mine = (await client.get("/v1/admin/workers")).json()
            assert all(w["run_ids"] == [] for w in mine)  # no other tenant's runs
            assert (await client.get("/v1/admin/tenant")).json()["max_running"] is None
        async with api.client(user) as client:
            for path in ("/v1/admin/tenant", "/v1/admin/workers", "/v1/admin/overview"):
                response = await client.get(path)
                assert response.status_code == 403
                assert response.json()["error"]["code"] == "forbidden"
        release.set()
