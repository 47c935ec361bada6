"""runlane.run_listing lists every run and nothing else (migration 0030).

The listings read run_listing, written by a trigger when runs are
inserted and deleted by one when they are; a run missing from it would
never show in a listing, and a row left behind would list a run's id
after the run is gone.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from runlane.lane_service import LaneService
from runlane.models import Outcome, RunStatus
from runlane.service import RunService
from runlane.store import RunStore
from tests.integration.lane_helpers import run_to_end, submit

Conn = psycopg.Connection[Any]


def unlisted_or_stale(sql: Conn) -> list[tuple[Any, ...]]:
    """Runs without their listing row as they are, and rows of no run."""
    return sql.execute(
        "SELECT r.id, l.run_id FROM runlane.runs AS r"
        " FULL JOIN runlane.run_listing AS l ON l.run_id = r.id"
        " WHERE (r.tenant, r.user_id, r.created_at) IS DISTINCT FROM"
        " (l.tenant, l.user_id, l.created_at)"
    ).fetchall()


def listed_runs(sql: Conn) -> int:
    row = sql.execute("SELECT count(*) FROM runlane.run_listing").fetchone()
    assert row is not None
    return int(row[0])


async def test_every_way_of_making_a_run_lists_it(
    service: RunService, store: RunStore, lanes: LaneService, sql: Conn
) -> None:
    laned = await submit(lanes, "thread-1", "one")  # a lane's dispatch inserts the run
    assert laned.run_id is not None
    await run_to_end(store, laned.run_id, Outcome.INTERRUPTED, interrupt={"q": 1})
    resumed, _ = await lanes.resume(laned.run_id, "yes")
    direct, _ = await service.submit("a", {}, tenant="t1", user_id="u1")
    keyed, created = await service.submit("a", {}, tenant="t1", user_id="u2", idempotency_key="k")
    again, created_again = await service.submit(
        "a", {}, tenant="t1", user_id="u2", idempotency_key="k"
    )
    assert created and not created_again and again.id == keyed.id
    sql.execute(
        "INSERT INTO runlane.runs (tenant, user_id, agent, input, max_attempts)"
        " SELECT 't2', 'u' || g, 'a', '{}', 3 FROM generate_series(1, 3) AS g"
    )

    assert listed_runs(sql) == 7
    assert unlisted_or_stale(sql) == []
    listed = {run.id for run in await service.list_runs(limit=50)}
    assert {direct.id, keyed.id, laned.run_id, resumed.id} <= listed and len(listed) == 7


async def test_pruned_runs_leave_the_listing(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    kept, _ = await service.submit("a", {}, tenant="t1")
    for _ in range(3):
        await service.submit("a", {}, tenant="t1")
    # Finished a day ago: past the retention given below.
    sql.execute(
        "UPDATE runlane.runs SET status = 'completed', finished_at = now() - interval '1 day'"
        " WHERE id <> %s",
        (kept.id,),
    )
    deleted, _ = await store.prune({RunStatus.COMPLETED: 60.0}, batch=2)
    assert deleted == 3
    assert listed_runs(sql) == 1 and unlisted_or_stale(sql) == []
    assert [run.id for run in await service.list_runs(tenant="t1")] == [kept.id]


def test_truncating_runs_empties_the_listing(sql: Conn) -> None:
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts)"
        " SELECT 'a', '{}', 3 FROM generate_series(1, 3)"
    )
    sql.execute("TRUNCATE runlane.runs CASCADE")
    assert listed_runs(sql) == 0


@pytest.mark.parametrize(
    "change",
    ["tenant = 'other'", "user_id = 'other'", "created_at = created_at - interval '1 hour'"],
)
async def test_what_a_listing_copies_cannot_change(
    service: RunService, sql: Conn, change: str
) -> None:
    run, _ = await service.submit("a", {}, tenant="t1", user_id="u1")
    with pytest.raises(psycopg.errors.CheckViolation, match="do not change"):
        sql.execute(f"UPDATE runlane.runs SET {change} WHERE id = %s", (run.id,))
    sql.rollback()
    # Naming a column without changing it is allowed.
    sql.execute("UPDATE runlane.runs SET tenant = tenant, status = status WHERE id = %s", (run.id,))
    assert unlisted_or_stale(sql) == []
    assert [r.id for r in await service.list_runs(tenant="t1", user_id="u1")] == [run.id]
