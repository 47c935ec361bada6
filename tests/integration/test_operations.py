"""Operators' levers: retention, workers alive, overview, bulk re-queue."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import psycopg
import pytest

from runlane import App, RunContext
from runlane.errors import InvalidInput
from runlane.models import Outcome, RunStatus
from runlane.operations import Operations
from runlane.pruner import Pruner
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import PRUNER_LOCK_KEY, RunStore
from runlane.worker import Worker
from tests.support import running_worker, wait_until

Conn = psycopg.Connection[Any]


async def finish_one(store: RunStore, outcome: Outcome, **kwargs: Any) -> Any:
    claimed = (await store.claim_batch(worker_id="w", limit=1, lease_seconds=30))[0]
    return await store.finish_attempt(claimed.id, claimed.lease_token, outcome, **kwargs)


async def test_pruner_deletes_old_finished_runs_with_their_history(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    kept, _ = await service.submit("a", {})
    old, _ = await service.submit("a", {})
    dead, _ = await service.submit("a", {}, max_attempts=1)
    for _ in (kept, old):
        claimed = (await store.claim_batch(worker_id="w", limit=1, lease_seconds=30))[0]
        await store.append_event(claimed.id, claimed.lease_token, "token", {})
        await store.finish_attempt(claimed.id, claimed.lease_token, Outcome.COMPLETED)
    await finish_one(store, Outcome.RETRY, retry_delay_seconds=0)
    pending, _ = await service.submit("a", {})
    sql.execute(
        "UPDATE runlane.runs SET finished_at = now() - interval '8 days' WHERE id IN (%s, %s)",
        (old.id, dead.id),
    )
    pruner = Pruner(
        store,
        retention={"completed": 7 * 86400, "dead": 30 * 86400},
        interval_seconds=60,
    )
    assert await pruner.run_once() == (1, 0)
    left = {row[0] for row in sql.execute("SELECT id FROM runlane.runs").fetchall()}
    assert left == {kept.id, dead.id, pending.id}
    assert sql.execute(
        "SELECT count(*) FROM runlane.attempts WHERE run_id = %s", (old.id,)
    ).fetchone() == (0,)
    assert sql.execute(
        "SELECT count(*) FROM runlane.run_events WHERE run_id = %s", (old.id,)
    ).fetchone() == (0,)


async def test_one_pruner_at_a_time(store: RunStore, db_url: str) -> None:
    with psycopg.connect(db_url) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s)", (PRUNER_LOCK_KEY,))
        assert await store.prune({RunStatus.COMPLETED: 0}, exclusive=True) is None


async def test_prune_on_demand_and_pruning_deletes_in_batches(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, status, finished_at)"
        " SELECT 'a', '{}', 3, 'completed', now() - interval '1 hour'"
        " FROM generate_series(1, 1200)"
    )
    ops = Operations(service)
    assert await ops.prune(older_than_seconds=7200) == (0, 0)
    assert await ops.prune(older_than_seconds=60) == (1200, 0)
    with pytest.raises(InvalidInput):
        await ops.prune(older_than_seconds=-1)


def test_retention_settings() -> None:
    settings = Settings(retention_seconds=100, retention_by_status={"dead": 1000})
    assert settings.retention() == {
        "completed": 100,
        "failed": 100,
        "dead": 1000,
        "cancelled": 100,
    }
    with pytest.raises(ValueError, match="retention_by_status"):
        Settings(retention_by_status={"interrupted": 1})


async def test_workers_are_seen_alive_with_their_runs_and_marked_stopped(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)
    started = asyncio.Event()
    release = asyncio.Event()

    @app.agent("hold")
    async def hold(ctx: RunContext) -> Any:
        started.set()
        await release.wait()
        return None

    ops = Operations(service)
    run, _ = await service.submit("hold", {})
    async with running_worker(app, settings, concurrency=3) as worker:
        await asyncio.wait_for(started.wait(), 10)

        async def seen() -> Any:
            rows = [w for w in await ops.workers() if w["id"] == worker.worker_id]
            return rows[0] if rows and rows[0]["run_ids"] else None

        row = await wait_until(seen, message="worker seen with its run")
        assert row["alive"] and row["concurrency"] == 3 and row["run_ids"] == [run.id]
        assert row["agents"] == ["hold"]
        release.set()
    rows = [w for w in await ops.workers() if w["id"] == worker.worker_id]
    assert rows and not rows[0]["alive"] and rows[0]["stopped_at"] is not None


async def test_overview_counts_live_runs_dead_letter_and_oldest_pending(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    await service.submit("a", {}, tenant="t2", max_attempts=1)
    await service.submit("a", {}, tenant="t1")
    await service.submit("b", {}, tenant="t1")
    sql.execute("UPDATE runlane.runs SET available_at = now() - interval '90 seconds'")
    await finish_one(store, Outcome.RETRY, retry_delay_seconds=0)  # -> dead
    overview = await Operations(service).overview()
    live = {(r["status"], r["agent"], r["tenant"]): r["count"] for r in overview.live}
    assert sum(live.values()) == 2 and overview.dead == 1
    assert overview.oldest_pending_seconds is not None
    assert 89 < overview.oldest_pending_seconds < 120


async def test_bulk_requeue_of_dead_runs_of_one_agent(service: RunService, store: RunStore) -> None:
    for agent in ("mail", "mail", "chat"):
        await service.submit(agent, {}, max_attempts=1)
    for _ in range(3):
        await finish_one(store, Outcome.RETRY, retry_delay_seconds=0)
    ops = Operations(service)
    done, refused = await ops.requeue_many(statuses=[RunStatus.DEAD], agent="mail")
    assert len(done) == 2 and refused == []
    assert {r.status for r in done} == {RunStatus.PENDING}
    assert await store.dead_count() == 1
    with pytest.raises(InvalidInput):
        await ops.requeue_many(statuses=[RunStatus.COMPLETED])


async def test_tenant_caps_can_be_set_listed_and_removed(service: RunService) -> None:
    ops = Operations(service)
    await ops.set_tenant_cap("acme", 5)
    await ops.set_tenant_cap("acme", 3)
    assert [(c["tenant"], c["max_running"], c["running"]) for c in await ops.tenant_caps()] == [
        ("acme", 3, 0)
    ]
    await ops.set_tenant_cap("acme", None)
    assert await ops.tenant_caps() == []
    with pytest.raises(InvalidInput):
        await ops.set_tenant_cap("acme", -1)


async def test_worker_metrics_are_served(service: RunService, settings: Settings) -> None:
    import httpx

    from tests.api_support import free_port

    app = App(settings)

    @app.agent("m")
    async def m(ctx: RunContext) -> Any:
        if ctx.input.get("fail"):
            raise ValueError("no")
        return None

    port = free_port()
    async with running_worker(app, settings, metrics_port=port) as worker:
        ok, _ = await service.submit("m", {})
        bad, _ = await service.submit("m", {"fail": True}, max_attempts=1)
        await wait_until(lambda: _ended(service, ok.id, bad.id), message="both runs ended")

        async def scraped() -> str | None:
            async with httpx.AsyncClient() as client:
                text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            return text if "runlane_queue_dead_runs 1.0" in text else None

        text = await wait_until(scraped, message="metrics with the dead run")
        assert worker.claims == 2
    assert 'runlane_worker_attempts_finished_total{outcome="completed"} 1.0' in text
    assert 'runlane_worker_attempts_finished_total{outcome="retry"} 1.0' in text
    assert "runlane_worker_claims_total 2.0" in text
    assert 'runlane_worker_handler_seconds_count{agent="m"} 2.0' in text
    assert "runlane_worker_wakeups_total" in text


async def test_worker_gauges_show_runs_in_progress(service: RunService, settings: Settings) -> None:
    import httpx

    from tests.api_support import free_port

    app = App(settings)
    release = asyncio.Event()

    @app.agent("slow")
    async def slow(ctx: RunContext) -> Any:
        await release.wait()
        return None

    port = free_port()

    async def scraped(*lines: str) -> bool:
        async with httpx.AsyncClient() as client:
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        return all(f"\n{line}\n" in text for line in lines)

    async with running_worker(app, settings, metrics_port=port, concurrency=4):
        assert await scraped("runlane_worker_running 0.0", "runlane_worker_held 0.0")
        first, _ = await service.submit("slow", {})
        await service.submit("slow", {})
        await wait_until(
            lambda: scraped("runlane_worker_running 2.0", "runlane_worker_held 2.0"),
            message="two handlers shown running",
        )
        release.set()
        await wait_until(
            lambda: scraped("runlane_worker_running 0.0", "runlane_worker_held 0.0"),
            message="gauges back to zero",
        )
        assert (await service.get(first.id)).status is RunStatus.COMPLETED


async def _ended(service: RunService, *run_ids: Any) -> bool:
    runs = [await service.get(run_id) for run_id in run_ids]
    return all(run.status.is_terminal for run in runs)


async def test_gone_and_stopped_workers_are_listed_then_forgotten(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    # Three registry rows as workers leave them: one heartbeating, one that
    # went silent (killed), one shut down cleanly; then the last two age.
    sql.execute(
        "INSERT INTO runlane.workers (id, hostname, pid, concurrency, last_seen_at, stopped_at)"
        " VALUES ('h:1:a', 'h', 1, 4, now(), NULL),"
        " ('h:2:b', 'h', 2, 4, now() - interval '5 minutes', NULL),"
        " ('h:3:c', 'h', 3, 4, now() - interval '5 minutes', now() - interval '5 minutes')"
    )
    ops = Operations(service)
    states = {w["id"]: (w["alive"], w["stopped_at"] is not None) for w in await ops.workers()}
    assert states == {"h:1:a": (True, False), "h:2:b": (False, False), "h:3:c": (False, True)}
    # The pruner keeps them while they are recent ...
    await store.prune({RunStatus.COMPLETED: 86400}, exclusive=True)
    assert sql.execute("SELECT count(*) FROM runlane.workers").fetchone() == (3,)
    # ... and deletes them, gone or stopped, an hour after they were last seen.
    sql.execute(
        "UPDATE runlane.workers SET last_seen_at = now() - interval '61 minutes',"
        " stopped_at = CASE WHEN stopped_at IS NULL THEN NULL"
        " ELSE now() - interval '61 minutes' END WHERE id <> 'h:1:a'"
    )
    assert {w["id"] for w in await ops.workers()} == {"h:1:a"}
    await store.prune({RunStatus.COMPLETED: 86400}, exclusive=True)
    rows = sql.execute("SELECT id FROM runlane.workers").fetchall()
    assert rows == [("h:1:a",)]


async def test_a_taken_metrics_port_fails_start_and_leaves_nothing_open(
    settings: Settings,
) -> None:
    app = App(settings)

    @app.agent("m")
    async def m(ctx: RunContext) -> Any:
        return None

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        assert settings.database_url is not None
        worker = Worker(
            app, settings.database_url, settings=settings, metrics_port=taken.getsockname()[1]
        )
        with pytest.raises(OSError):
            await worker.start()
    assert worker.store.pool.closed
