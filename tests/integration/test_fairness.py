"""Noisy tenants and starving priorities: tenant caps and priority aging."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

from runlane import App, RunContext
from runlane.models import RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import RunStore
from tests.support import running_worker, wait_until

Conn = psycopg.Connection[Any]


def busy_app(settings: Settings, seconds: float) -> App:
    app = App(settings)

    @app.agent("work")
    async def work(ctx: RunContext) -> Any:
        await asyncio.sleep(seconds)
        return None

    return app


async def test_a_capped_tenant_never_exceeds_its_cap_and_others_flow(
    service: RunService, store: RunStore, settings: Settings, sql: Conn
) -> None:
    sql.execute(
        "INSERT INTO runlane.runs (tenant, agent, input, max_attempts)"
        " SELECT 'noisy', 'work', '{}', 3 FROM generate_series(1, 5000)"
    )
    await store.set_tenant_limit("noisy", 2)
    app = busy_app(settings, 0.05)
    peak = 0
    async with (
        running_worker(app, settings, concurrency=8),
        running_worker(app, settings, concurrency=8),
    ):

        def sample() -> int:
            row = sql.execute(
                "SELECT count(*) FROM runlane.runs WHERE tenant = 'noisy'"
                " AND status IN ('running', 'cancel_requested')"
            ).fetchone()
            return int(row[0]) if row else 0

        await wait_until(lambda: sample() > 0, message="noisy tenant running")
        quiet = [(await service.submit("work", {}, tenant="quiet"))[0] for _ in range(10)]
        submitted = time.monotonic()
        started_quiet = set()
        while len(started_quiet) < len(quiet):
            peak = max(peak, sample())
            for run in quiet:
                if (await service.get(run.id)).started_at is not None:
                    started_quiet.add(run.id)
            assert time.monotonic() - submitted < 5, "the quiet tenant waited"
            await asyncio.sleep(0.01)
        for _ in range(100):  # keep sampling the noisy tenant a while
            peak = max(peak, sample())
            await asyncio.sleep(0.01)
    assert 1 <= peak <= 2
    pending = sql.execute(
        "SELECT count(*) FROM runlane.runs WHERE tenant = 'noisy' AND status = 'pending'"
    ).fetchone()
    assert pending is not None and pending[0] > 4000  # the cap held the backlog back
    limits = await store.list_tenant_limits()
    assert [(r["tenant"], r["max_running"]) for r in limits] == [("noisy", 2)]


async def test_a_tenant_at_its_cap_does_not_hide_the_runs_behind_its_backlog(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    # The capped tenant's runs come first in claim order and it is full:
    # one claim must reach past them to the other tenant's run.
    sql.execute(
        "INSERT INTO runlane.runs (tenant, agent, input, max_attempts)"
        " SELECT 'noisy', 'work', '{}', 3 FROM generate_series(1, 50)"
    )
    await store.set_tenant_limit("noisy", 2)
    held = await store.claim_batch(worker_id="w1", limit=2, lease_seconds=30)
    assert [c.tenant for c in held] == ["noisy", "noisy"]
    quiet, _ = await service.submit("work", {}, tenant="quiet")
    claimed = await store.claim_batch(worker_id="w2", limit=8, lease_seconds=30)
    assert [c.id for c in claimed] == [quiet.id]


async def test_a_cap_of_zero_pauses_a_tenant_and_removing_it_resumes(
    service: RunService, store: RunStore, settings: Settings
) -> None:
    await store.set_tenant_limit("paused", 0)
    run, _ = await service.submit("work", {}, tenant="paused")
    async with running_worker(busy_app(settings, 0), settings) as worker:
        other, _ = await service.submit("work", {}, tenant="other")
        await wait_until(
            lambda: _status(service, other.id, RunStatus.COMPLETED), message="other tenant"
        )
        assert (await service.get(run.id)).status is RunStatus.PENDING
        claims = worker.claims
        await store.set_tenant_limit("paused", None)
        await wait_until(lambda: _status(service, run.id, RunStatus.COMPLETED), message="resumed")
        assert worker.claims > claims


async def feed_high_priority(service: RunService, stop: asyncio.Event) -> None:
    """Keeps a backlog of priority-10 work, like a busy production queue."""
    while not stop.is_set():
        pending = await service.list_runs(statuses=[RunStatus.PENDING], limit=20)
        for _ in range(max(0, 10 - len(pending))):
            await service.submit("work", {"high": True}, priority=10)
        await asyncio.sleep(0.02)


async def test_aging_bounds_the_wait_of_a_low_priority_run(
    service: RunService, settings: Settings
) -> None:
    aging = 0.2
    settings = settings.model_copy(update={"priority_aging_seconds": aging})
    stop = asyncio.Event()
    feeder = asyncio.create_task(feed_high_priority(service, stop))
    try:
        async with running_worker(busy_app(settings, 0.02), settings, concurrency=2):
            await wait_until(
                lambda: _count(service, RunStatus.COMPLETED, 5), message="high work flowing"
            )
            low, _ = await service.submit("work", {"low": True}, priority=0)
            done = await wait_until(
                lambda: _status(service, low.id, RunStatus.COMPLETED),
                timeout=15,
                message="low priority run",
            )
    finally:
        stop.set()
        await feeder
    waited = (done.started_at - done.created_at).total_seconds()
    # The documented bound: (difference in priority + 1) * aging, plus the
    # runs already claimed ahead of it.
    assert waited <= (10 + 1) * aging + 1.0


async def test_without_aging_high_priority_work_always_goes_first(
    service: RunService, settings: Settings
) -> None:
    settings = settings.model_copy(update={"priority_aging_seconds": 0.0})
    stop = asyncio.Event()
    feeder = asyncio.create_task(feed_high_priority(service, stop))
    try:
        async with running_worker(busy_app(settings, 0.02), settings, concurrency=2):
            await wait_until(
                lambda: _count(service, RunStatus.COMPLETED, 5), message="high work flowing"
            )
            low, _ = await service.submit("work", {"low": True}, priority=0)
            submitted = time.monotonic()
            # Far past the aged bound of the test above, it has not started.
            await wait_until(
                lambda: _count(service, RunStatus.COMPLETED, 400),
                timeout=30,
                message="much high work done",
            )
            assert time.monotonic() - submitted > (10 + 1) * 0.2 + 1.0
            assert (await service.get(low.id)).started_at is None
    finally:
        stop.set()
        await feeder


async def _status(service: RunService, run_id: Any, status: RunStatus) -> Any:
    run = await service.get(run_id)
    return run if run.status is status else None


async def _count(service: RunService, status: RunStatus, at_least: int) -> bool:
    counts = await service.store.count_runs_by_status()
    return counts.get(status, 0) >= at_least
