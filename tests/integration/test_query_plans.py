"""Queries read the rows they need, whatever the statistics say.

PostgreSQL plans from statistics taken at the last ANALYZE. Taken while
the runs were pending, they say almost nothing is leased; a fenced write
that also tested the status could then go through the partial index of
leased runs and read every leased run to find its one (measured: 12-15 ms
per event with 20,000 runs leased). The plans are checked here rather than
timed: a plan that reads thousands of rows to answer a few is the defect,
at any size.
"""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import ClientCursor
from psycopg.types.json import Jsonb

from runlane.queries import named_queries
from runlane.store import RunStore

Conn = psycopg.Connection[Any]
LEASED = 2000


@pytest.fixture
async def leased(store: RunStore, sql: Conn) -> list[tuple[UUID, UUID]]:
    """LEASED runs claimed after an ANALYZE that saw them all pending."""
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts)"
        " SELECT 'a', '{}', 3 FROM generate_series(1, %s)",
        (LEASED,),
    )
    sql.execute("ANALYZE runlane.runs")
    runs = []
    while batch := await store.claim_batch(worker_id="w", limit=500, lease_seconds=300):
        runs += [(c.run.id, c.lease_token) for c in batch]
    assert len(runs) == LEASED
    return runs


def plan(sql: Conn, name: str, params: dict[str, Any], file_name: str = "queries.sql") -> str:
    text = ClientCursor(sql).mogrify(named_queries(file_name)[name], params)
    with sql.transaction(force_rollback=True):
        rows = sql.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + text).fetchall()
    return "\n".join(str(row[0]) for row in rows)


@pytest.mark.parametrize(
    "name", ["append_event", "save_checkpoint", "count_turn", "record_effect", "finish_attempts"]
)
async def test_fenced_writes_find_the_run_by_primary_key(
    leased: list[tuple[UUID, UUID]], sql: Conn, name: str
) -> None:
    run_id, token = leased[LEASED // 2]
    params: dict[str, Any] = {
        "run_id": run_id,
        "lease_token": token,
        "kind": "note",
        "data": Jsonb({}),
        "checkpoint": Jsonb({}),
        "key": "k",
        "result": Jsonb(1),
        # finish_attempts: one completed attempt
        "run_ids": [run_id],
        "lease_tokens": [token],
        "outcomes": ["completed"],
        "outputs": [None],
        "errors": [None],
        "retry_delays": [None],
        "interrupts": [None],
        "interrupt_expires": [None],
        "notify": False,
    }
    shown = plan(sql, name, params)
    assert "runs_leased_idx" not in shown, shown
    assert "runs_pkey" in shown, shown


async def test_a_heartbeat_checks_each_lease_by_primary_key(
    leased: list[tuple[UUID, UUID]], sql: Conn
) -> None:
    held = leased[:10]
    shown = plan(
        sql,
        "renew_leases",
        {
            "worker_id": "w",
            "hostname": "h",
            "pid": 1,
            "agents": ["a"],
            "concurrency": 10,
            "run_ids": [r for r, _ in held],
            "lease_tokens": [t for _, t in held],
            "lease_seconds": 300,
        },
    )
    assert "runs_leased_idx" not in shown, shown


def most_rows_touched(shown: str) -> int:
    """The most rows any plan node returned or filtered out."""
    counts = [int(n) for n in re.findall(r"actual rows=(\d+)", shown)]
    counts += [int(n) for n in re.findall(r"Rows Removed by (?:Join )?Filter: (\d+)", shown)]
    return max(counts, default=0)


HISTORY = 3000


@pytest.fixture
def history(sql: Conn) -> None:
    """HISTORY runs completed a minute ago, analyzed."""
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, status, finished_at)"
        " SELECT 'a', '{}', 3, 'completed', now() - interval '1 minute'"
        " FROM generate_series(1, %s)",
        (HISTORY,),
    )
    sql.execute("ANALYZE runlane.runs")


async def test_queue_gauges_read_live_runs_only(history: None, sql: Conn) -> None:
    sql.execute("INSERT INTO runlane.runs (agent, input, max_attempts) VALUES ('a', '{}', 3)")
    shown = plan(sql, "queue_gauges", {"tenant": None})
    assert most_rows_touched(shown) < 100, shown


async def test_a_prune_pass_reads_only_the_runs_it_deletes(history: None, sql: Conn) -> None:
    sql.execute(
        "UPDATE runlane.runs SET finished_at = now() - interval '30 days'"
        " WHERE id IN (SELECT id FROM runlane.runs LIMIT 5)"
    )
    shown = plan(
        sql,
        "prune_runs",
        {
            "statuses": ["completed", "failed", "dead", "cancelled"],
            "older_than_seconds": [7 * 86400.0, 14 * 86400.0, 14 * 86400.0, 7 * 86400.0],
            "batch": 100,
        },
    )
    # The five due, deleted (PostgreSQL 18 prints rows as 5.00).
    assert re.search(r"Delete on runs r \(actual rows=5(\.0+)? ", shown), shown
    assert most_rows_touched(shown) < 100, shown


async def test_an_expired_interrupt_is_found_by_primary_key(history: None, sql: Conn) -> None:
    # Statistics saw no interrupted run; now thousands wait, all expired.
    sql.execute(
        "UPDATE runlane.runs SET status = 'interrupted', finished_at = NULL,"
        " interrupt_expires_at = now() - interval '1 minute'"
    )
    row = sql.execute("SELECT id FROM runlane.runs LIMIT 1").fetchone()
    assert row is not None
    shown = plan(sql, "expire_interrupt", {"run_id": row[0]}, "lanes.sql")
    assert most_rows_touched(shown) < 100, shown
