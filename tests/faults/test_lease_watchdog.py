"""A worker cut off from PostgreSQL stops its runs before their leases
expire; another worker then finishes them; the cut-off worker's late
writes are refused."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from runlane import App, RunContext
from runlane.database import create_pool
from runlane.models import RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import RunStore
from runlane.worker import Worker
from tests.faults.tcp_proxy import BlackHoleProxy
from tests.support import running_worker, wait_until


@pytest.fixture
async def proxy(db_url: str) -> AsyncIterator[BlackHoleProxy]:
    proxy = BlackHoleProxy(db_url)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


async def test_cut_off_worker_stops_before_lease_expiry_and_another_finishes(
    proxy: BlackHoleProxy,
    service: RunService,
    settings: Settings,
    sql: psycopg.Connection[Any],
) -> None:
    app = App(settings)
    started = asyncio.Event()
    stopped_at: list[float] = []
    lease_left_when_stopped: list[float] = []
    attempts_seen: list[int] = []

    @app.agent("long")
    async def long(ctx: RunContext) -> Any:
        attempts_seen.append(ctx.attempt)
        if ctx.attempt > 1:
            return {"finished_by_attempt": ctx.attempt}
        started.set()
        try:
            await asyncio.sleep(3600)  # no safe point: only the watchdog can stop this
        except asyncio.CancelledError:
            stopped_at.append(time.monotonic())
            # Read the lease through a direct connection the moment work stops.
            row = sql.execute(
                "SELECT extract(epoch FROM lease_expires_at - now())::float FROM runlane.runs"
            ).fetchone()
            lease_left_when_stopped.append(row[0] if row and row[0] is not None else -1.0)
            raise
        return None

    run, _ = await service.submit("long", {}, max_attempts=3)
    cut_off = Worker(app, proxy.url(), settings=settings, run_reaper=False, worker_id="cut-off")
    await cut_off.start()
    try:
        await asyncio.wait_for(started.wait(), 10)
        claimed_token = (await service.get(run.id)).lease_token
        cut_at = time.monotonic()
        proxy.black_hole()

        await wait_until(lambda: stopped_at, timeout=settings.lease_seconds * 2, message="stop")
        # Stopped by the watchdog, while the database still counted the lease as live.
        assert lease_left_when_stopped[0] > 0
        assert stopped_at[0] - cut_at < settings.lease_seconds

        # After expiry, a healthy worker (with the reaper) finishes the run.
        healthy_settings = settings.model_copy(update={"reaper_interval_seconds": 0.2})
        async with running_worker(app, healthy_settings, worker_id="healthy"):
            # Skip the reaper's backoff once the run is re-queued.
            async def requeued() -> bool:
                row = sql.execute(
                    "UPDATE runlane.runs SET available_at = now()"
                    " WHERE status = 'pending' AND attempts = 1 RETURNING id"
                ).fetchone()
                return row is not None or (await service.get(run.id)).attempts > 1

            await wait_until(requeued, timeout=settings.lease_seconds * 3, message="re-queue")
            done = await wait_until(
                lambda: _completed(service, run.id), timeout=15, message="completion"
            )
        assert done.output == {"finished_by_attempt": 2}
        attempts = await service.attempts(run.id)
        assert [(a.worker_id, a.outcome) for a in attempts] == [
            ("cut-off", "lease_expired"),
            ("healthy", "completed"),
        ]

        # The partition ends: the cut-off worker's late writes change nothing.
        proxy.restore()
        pool = create_pool(proxy.url(), min_size=1, max_size=1)
        await pool.open()
        try:
            late = RunStore(pool)
            assert claimed_token is not None
            assert await late.append_event(run.id, claimed_token, "late", {}) is None
            assert await late.renew_leases([(run.id, claimed_token)], lease_seconds=30) == {}
        finally:
            await pool.close()
        final = await service.get(run.id)
        assert final.status is RunStatus.COMPLETED and final.last_event_seq == 0
    finally:
        proxy.restore()
        await asyncio.wait_for(cut_off.stop(grace_seconds=0.5), 30)
    assert attempts_seen == [1, 2]


async def _completed(service: RunService, run_id: Any) -> Any:
    run = await service.get(run_id)
    return run if run.status is RunStatus.COMPLETED else None


async def test_transient_heartbeat_errors_within_the_lease_do_not_kill_the_run(
    proxy: BlackHoleProxy,
    service: RunService,
    settings: Settings,
) -> None:
    """A short partition (shorter than the lease) costs a few heartbeats and
    nothing else: the run keeps its lease and completes in its first attempt."""
    app = App(settings)
    started = asyncio.Event()
    proceed = asyncio.Event()

    @app.agent("steady")
    async def steady(ctx: RunContext) -> Any:
        started.set()
        await proceed.wait()
        return {"attempt": ctx.attempt}

    run, _ = await service.submit("steady", {})
    worker = Worker(app, proxy.url(), settings=settings, run_reaper=False)
    await worker.start()
    try:
        await asyncio.wait_for(started.wait(), 10)
        ticks_before = worker.heartbeat.ticks
        proxy.black_hole()
        # Two failed renewals, well within the watchdog's 80% of the lease.
        await wait_until(lambda: worker.heartbeat.failures >= 2, message="failed renewals")
        proxy.restore()
        await wait_until(
            lambda: worker.heartbeat.ticks > ticks_before + 1, timeout=10, message="renewals"
        )
        proceed.set()
        done = await wait_until(lambda: _completed(service, run.id), timeout=15, message="done")
    finally:
        await asyncio.wait_for(worker.stop(grace_seconds=0.5), 30)
    assert done.output == {"attempt": 1} and done.attempts == 1
