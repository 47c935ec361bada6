"""PostgreSQL restarts mid-run: the worker reconnects by itself, and every
run still ends completed. Uses its own embedded server, never a shared one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from runlane.database import create_pool
from runlane.embedded import EmbeddedPostgres
from runlane.migrations import migrate
from runlane.models import RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import RunStore
from tests.api_support import create_key, serve_api
from tests.conftest import database_url
from tests.faults.fault_app import app
from tests.support import embedded_test_server, running_worker, wait_until


@pytest.fixture
def own_server() -> Iterator[tuple[EmbeddedPostgres, str]]:
    with embedded_test_server() as server:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE restart_test")
        url = database_url(server.url(), "restart_test")
        migrate(url)
        yield server, url


async def test_worker_survives_a_postgres_restart_mid_run(
    own_server: tuple[EmbeddedPostgres, str],
) -> None:
    server, url = own_server
    settings = Settings(
        database_url=url,
        lease_seconds=4.0,
        heartbeat_seconds=0.5,
        poll_seconds=0.2,
        reaper_interval_seconds=0.5,
    )
    pool = create_pool(url, min_size=1, max_size=4)
    await pool.open()
    service = RunService(RunStore(pool), settings)
    try:
        before = [
            (await service.submit("safe", {"steps": 30, "step_seconds": 0.05}))[0] for _ in range(4)
        ]
        async with running_worker(app, settings, concurrency=4) as worker:
            assert worker.listener is not None

            async def working() -> bool:
                runs = [await service.get(r.id) for r in before]
                return sum(r.last_event_seq > 0 and not r.status.is_terminal for r in runs) >= 2

            await wait_until(working, timeout=20, message="runs in flight")
            await asyncio.wait_for(worker.listener.connected.wait(), 10)

            started_before = _postmaster_start(url)
            await asyncio.to_thread(server.stop, "fast")
            await asyncio.to_thread(server.start)
            assert _postmaster_start(url) > started_before

            # Both the listener and the pools come back by themselves.
            await wait_until(
                lambda: worker.listener is not None and worker.listener.connected.is_set(),
                timeout=30,
                message="listener reconnected",
            )
            after = [
                (await _submit_retrying(service, {"steps": 3, "step_seconds": 0.01}))
                for _ in range(4)
            ]

            async def all_completed() -> bool:
                runs = [await service.get(r.id) for r in before + after]
                bad = [r for r in runs if r.status in (RunStatus.FAILED, RunStatus.DEAD)]
                assert not bad, f"runs ended badly: {bad}"
                return all(r.status is RunStatus.COMPLETED for r in runs)

            # Runs cut mid-flight either carried on or were retried after
            # their lease expired (backoff ~5 s).
            await wait_until(all_completed, timeout=60, message="every run completed")
            for run in before:
                # Each run in flight during the restart still wrote all its steps.
                events = await service.events(run.id)
                assert sorted({e.data["step"] for e in events}) == list(range(30))
    finally:
        await pool.close()


async def test_the_api_serves_again_after_a_postgres_restart_without_a_retry(
    own_server: tuple[EmbeddedPostgres, str],
) -> None:
    """The API's pool checks a checkout without a round trip: connections
    the restart closed while idle are replaced, not handed to requests."""
    server, url = own_server
    settings = Settings(database_url=url, api_key_cache_seconds=0)
    async with serve_api(settings, keepalive_seconds=0.5) as api:
        secret = await create_key(api.context.keys, "acme", "ann")
        async with api.client(secret) as client:

            async def submit(thread: str) -> dict[str, Any]:
                response = await client.post(
                    f"/v1/threads/{thread}/requests", json={"agent": "safe", "input": {}}
                )
                assert response.status_code == 201, response.text
                body: dict[str, Any] = response.json()
                return body

            # Fill the pool with idle connections.
            await asyncio.gather(*(submit(f"before-{i}") for i in range(8)))
            await asyncio.wait_for(api.context.hub.listener.connected.wait(), 10)

            started_before = _postmaster_start(url)
            await asyncio.to_thread(server.stop, "fast")
            await asyncio.to_thread(server.start)
            assert _postmaster_start(url) > started_before

            # Every request after the restart succeeds at its first try.
            after = await asyncio.gather(*(submit(f"after-{i}") for i in range(8)))
            assert all(body["status"] == "dispatched" for body in after)
            listed = await client.get("/v1/runs", params={"limit": 100})
            assert listed.status_code == 200 and len(listed.json()["items"]) == 16
            # The event hub's listener is back too.
            await wait_until(
                lambda: api.context.hub.listener.connected.is_set(),
                timeout=30,
                message="listener reconnected",
            )


def _postmaster_start(url: str) -> Any:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
        assert row is not None
        return row[0]


async def _submit_retrying(service: RunService, payload: dict[str, Any]) -> Any:
    """The test's own client also meets the restart; it retries its submit."""
    for _ in range(50):
        try:
            run, _ = await service.submit("safe", payload)
            return run
        except psycopg.OperationalError:
            await asyncio.sleep(0.1)
    raise AssertionError("could not submit after the restart")
