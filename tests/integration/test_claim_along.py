"""A worker's outcome batch that ends lanes' runs also claims, in the same
transaction, what the worker has room for: a lane's next run starts
without a NOTIFY and a claim of its own, and the claim is the usual one
(best runs first), within the worker's free slots."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from runlane import App, RunContext
from runlane.lane_service import LaneService
from runlane.models import Outcome, RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import ClaimSpec, Finish, RunStore
from tests.integration.lane_helpers import AGENT, claim, submit
from tests.support import running_worker, wait_until

Conn = psycopg.Connection[Any]


def recording_app(settings: Settings, started: list[str]) -> App:
    app = App(settings)

    @app.agent(AGENT)
    async def work(ctx: RunContext) -> Any:
        started.append(ctx.input["text"])
        return ctx.input["text"]

    return app


async def test_a_lanes_next_run_starts_in_the_transaction_that_ended_the_last(
    service: RunService, lanes: LaneService, settings: Settings, sql: Conn
) -> None:
    texts = [f"m{i}" for i in range(6)]
    for text in texts:
        await submit(lanes, "t", text)
    started: list[str] = []
    async with running_worker(recording_app(settings, started), settings, concurrency=1) as worker:

        async def all_done() -> bool:
            counts = await service.store.count_runs_by_status()
            return counts.get(RunStatus.COMPLETED, 0) == len(texts)

        await wait_until(all_done, timeout=30, message="the lane drained")
        assert worker.claims_along == len(texts) - 1
    assert started == texts
    # Each next attempt began at its predecessor's end: the same
    # transaction (now() is the transaction's start).
    rows = sql.execute(
        "SELECT a.started_at, a.ended_at FROM runlane.attempts AS a"
        " JOIN runlane.runs AS r ON r.id = a.run_id ORDER BY a.started_at"
    ).fetchall()
    assert [rows[i + 1][0] == rows[i][1] for i in range(len(rows) - 1)] == [True] * (len(texts) - 1)


async def test_the_claim_along_takes_the_best_run_not_the_lanes_own(
    service: RunService, lanes: LaneService, settings: Settings
) -> None:
    """With one slot, a higher-priority run waiting elsewhere goes before the
    lane's next request: claiming along changes when runs are claimed, not
    which."""
    app = App(settings)
    started: list[str] = []
    first_running = asyncio.Event()
    may_return = asyncio.Event()

    @app.agent(AGENT)
    async def work(ctx: RunContext) -> Any:
        started.append(ctx.input["text"])
        if ctx.input["text"] == "first":
            first_running.set()
            await may_return.wait()
        return None

    await submit(lanes, "t", "first")
    await submit(lanes, "t", "second")
    async with running_worker(app, settings, concurrency=1) as worker:
        await wait_until(first_running.is_set, message="the lane's first run")
        await service.submit(AGENT, {"text": "urgent"}, priority=10)
        may_return.set()

        async def all_done() -> bool:
            counts = await service.store.count_runs_by_status()
            return counts.get(RunStatus.COMPLETED, 0) == 3

        await wait_until(all_done, timeout=30, message="every run completed")
        assert worker.claims_along >= 1
    assert started == ["first", "urgent", "second"]


async def test_an_outcome_batch_whose_claim_fails_keeps_nothing_and_locks_no_lane(
    store: RunStore, lanes: LaneService, sql: Conn
) -> None:
    """The lanes' lock, the outcomes and the claim along are one
    transaction: when the claim fails after the outcomes were written, no
    outcome is kept, no lane's next run is dispatched, no lane stays
    locked, and the connection serves the next batch."""
    first = await submit(lanes, "a", "a1")
    await submit(lanes, "a", "a2")
    assert first.run_id is not None
    run = await claim(store, first.run_id)
    done = Finish(run.id, run.lease_token, Outcome.COMPLETED, output="ok", lane_id=run.lane_id)
    # The relayed run's lease would end past the timestamps' range: the
    # claim fails when it takes that run, after the outcome's statement.
    failing = ClaimSpec(worker_id="test", limit=5, lease_seconds=1e300)

    with pytest.raises(psycopg.DataError, match="out of range"):
        await store.finish_attempts_and_claim([done], failing)

    assert sql.execute("SELECT status FROM runlane.runs").fetchall() == [("running",)]
    queued = sql.execute("SELECT count(*) FROM runlane.requests WHERE status = 'queued'")
    assert queued.fetchone() == (1,)
    locked = sql.execute(
        "SELECT id FROM runlane.lanes WHERE id = %s FOR UPDATE NOWAIT", [run.lane_id]
    ).fetchall()
    assert locked == [(run.lane_id,)]

    along = ClaimSpec(worker_id="test", limit=5, lease_seconds=30)
    statuses, claimed = await store.finish_attempts_and_claim([done], along)
    assert statuses == {run.id: RunStatus.COMPLETED}
    assert [c.input["text"] for c in claimed] == ["a2"]
