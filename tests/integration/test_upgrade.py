"""Upgrading a database that holds runs keeps them as they were.

Migration 0032 changes the types of runs.status and runs.kind to domains
and builds again the indexes that name status; the runs of every status
and kind written under 0031 must come through it unchanged, and the
functions it replaces must work on them.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from runlane.migrations import migrate
from runlane.models import RunStatus

KINDS = ["direct", "request", "resume"]


def runs_as_stored(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, status::text, kind::text, lease_token, tenant, created_at FROM runlane.runs"
        " ORDER BY id"
    ).fetchall()


def test_runs_of_every_status_and_kind_come_through_0032(empty_db_url: str) -> None:
    migrate(empty_db_url, up_to=31)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        for i, status in enumerate(list(RunStatus) * 3):
            leased = status in (RunStatus.RUNNING, RunStatus.CANCEL_REQUESTED)
            conn.execute(
                "INSERT INTO runlane.runs (agent, input, max_attempts, status, kind, lease_token,"
                " worker_id, tenant) VALUES ('a', '{}', 3, %s, %s, %s, %s, %s)",
                (
                    status,
                    KINDS[i % 3],
                    uuid.uuid4() if leased else None,
                    "w" if leased else None,
                    f"t{i % 2}",
                ),
            )
        before = runs_as_stored(conn)

    applied = migrate(empty_db_url)
    assert [m.version for m in applied][:1] == [32]

    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        assert runs_as_stored(conn) == before
        row = conn.execute(
            "SELECT pg_typeof(status)::text, pg_typeof(kind)::text FROM runlane.runs LIMIT 1"
        ).fetchone()
        assert row == ("runlane.run_status", "runlane.run_kind")
        # The replaced functions work on the migrated runs: the gauges
        # count the live ones, a claim takes the pending ones (read through
        # the rebuilt claim index) and the outcome write ends them.
        gauges = conn.execute(
            "SELECT status, sum(count)::int FROM runlane.queue_gauges(NULL) GROUP BY status"
            " ORDER BY status"
        ).fetchall()
        assert gauges == [("cancel_requested", 3), ("pending", 3), ("running", 3)]
        claimed = conn.execute(
            "SELECT id, lease_token FROM runlane.claim_runs('w2', NULL, 10, 30, 60)"
        ).fetchall()
        assert len(claimed) == 3
        ended = conn.execute(
            "SELECT run_id, run_status FROM runlane.finish_attempts(%s, %s,"
            " array_fill('completed'::text, ARRAY[3]), array_fill(NULL::jsonb, ARRAY[3]),"
            " array_fill(NULL::jsonb, ARRAY[3]), array_fill(NULL::float8, ARRAY[3]),"
            " array_fill(NULL::jsonb, ARRAY[3]), array_fill(NULL::float8, ARRAY[3]), false)",
            ([c[0] for c in claimed], [c[1] for c in claimed]),
        ).fetchall()
        assert sorted(ended) == sorted((c[0], "completed") for c in claimed)
