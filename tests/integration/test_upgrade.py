"""Upgrading a database that holds runs keeps them as they were.

Migration 0032 changes the types of runs.status and runs.kind to domains
and builds again the indexes that name status; the runs of every status
and kind written under 0031 must come through it unchanged, and the
functions it replaces must work on them. Migration 0035 moves the
attempts in progress from their open rows into their runs: each must end
with one row, with the start it had.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from runlane.migrations import migrate
from runlane.models import RunStatus
from runlane.queries import named_queries

KINDS = ["direct", "request", "resume"]


def runs_as_stored(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, status::text, kind::text, lease_token, tenant, created_at FROM runlane.runs"
        " ORDER BY id"
    ).fetchall()


def finish_completed(conn: psycopg.Connection[Any], held: list[tuple[Any, Any]]) -> list[Any]:
    """Ends the attempts of ``held`` (run id, lease token) completed; the
    runs' new statuses."""
    return conn.execute(
        "SELECT run_id, run_status FROM runlane.finish_attempts(%s, %s,"
        " array_fill('completed'::text, ARRAY[%s]), array_fill(NULL::jsonb, ARRAY[%s]),"
        " array_fill(NULL::jsonb, ARRAY[%s]), array_fill(NULL::float8, ARRAY[%s]),"
        " array_fill(NULL::jsonb, ARRAY[%s]), array_fill(NULL::float8, ARRAY[%s]), false)",
        ([h[0] for h in held], [h[1] for h in held], *[len(held)] * 6),
    ).fetchall()


def claim_new_runs(conn: psycopg.Connection[Any], n: int, columns: str) -> list[Any]:
    """Submits ``n`` runs and claims them all as worker w1, through the
    schema's claim; the claimed runs' ``columns``."""
    conn.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts)"
        " SELECT 'a', '{}', 3 FROM generate_series(1, %s)",
        (n,),
    )
    claimed = conn.execute(
        f"SELECT {columns} FROM runlane.claim_runs('w1', NULL, %s, 30, 60)", (n,)
    ).fetchall()
    assert len(claimed) == n
    return claimed


def attempts_listed(conn: psycopg.Connection[Any], run_id: Any) -> list[tuple[Any, ...]]:
    """A run's attempts as the API lists them (list_attempts)."""
    return [
        tuple(row)
        for row in conn.execute(named_queries("queries.sql")["list_attempts"], {"run_id": run_id})
    ]


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
        ended = finish_completed(conn, claimed)
        assert sorted(ended) == sorted((c[0], "completed") for c in claimed)


def test_attempts_in_progress_come_through_0035(empty_db_url: str) -> None:
    migrate(empty_db_url, up_to=34)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        claimed = claim_new_runs(conn, 3, "id, lease_token")
        # One attempt ended under 0034 (its row updated), two in progress
        # (their rows open).
        assert finish_completed(conn, claimed[:1]) == [(claimed[0][0], "completed")]
        before = {
            row[0]: row
            for row in conn.execute(
                "SELECT run_id, attempt, worker_id, lease_token, started_at, ended_at, outcome"
                " FROM runlane.run_attempts"
            )
        }
        assert sum(1 for row in before.values() if row[5] is None) == 2

    applied = migrate(empty_db_url, up_to=35)
    assert [m.version for m in applied] == [35]

    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        # The open rows moved into their runs; the ended one stays.
        rows = conn.execute("SELECT run_id FROM runlane.run_attempts").fetchall()
        assert rows == [(claimed[0][0],)]
    # The listing reads the view of migration 0050, and the later outcome
    # writes and the reaper need the later migrations (0041's search for
    # expired leases): attempts begun before 0035 come through them all.
    migrate(empty_db_url)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        for run_id, _ in claimed:
            (listed,) = attempts_listed(conn, run_id)
            assert listed == before[run_id] + (None,)
        # The outcome write of an attempt begun before the upgrade writes
        # its row with the start it had.
        assert finish_completed(conn, claimed[1:2]) == [(claimed[1][0], "completed")]
        (ended,) = attempts_listed(conn, claimed[1][0])
        assert ended[:5] == before[claimed[1][0]][:5]
        assert ended[5] is not None and ended[6] == "completed"
        # The reaper ends the other one the same way.
        conn.execute(
            "UPDATE runlane.runs SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
            (claimed[2][0],),
        )
        reaped = conn.execute(
            named_queries("queries.sql")["reap_expired_leases"], {"run_id": None, "limit": 10}
        ).fetchall()
        assert [row[0] for row in reaped] == [claimed[2][0]]
        (expired,) = attempts_listed(conn, claimed[2][0])
        assert expired[:5] == before[claimed[2][0]][:5]
        assert expired[6] == "lease_expired"


def test_attempts_an_older_requeue_left_on_runs_move_in_0051(empty_db_url: str) -> None:
    migrate(empty_db_url, up_to=50)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        claimed = claim_new_runs(conn, 3, "id, lease_token, attempt_started_at")
        finish_completed(conn, [c[:2] for c in claimed])
        ended = dict(
            conn.execute(  # type: ignore[arg-type]
                "SELECT id, attempt_ended_at FROM runlane.runs"
            ).fetchall()
        )
        # Runs 2 and 3 re-queued as a process before 0050 does, leaving
        # their kept attempts; one of them then claimed again (its
        # attempt's number and start overwritten), the other not.
        conn.execute(
            "UPDATE runlane.runs SET status = 'pending', finished_at = NULL, attempts = 0"
            " WHERE id = ANY(%s)",
            ([claimed[1][0], claimed[2][0]],),
        )
        (again,) = conn.execute(
            "SELECT id, lease_token FROM runlane.claim_runs('w2', NULL, 1, 30, 60)"
        ).fetchall()
        reclaimed = again[0]
        untouched = ({claimed[1][0], claimed[2][0]} - {reclaimed}).pop()

    assert [m.version for m in migrate(empty_db_url, up_to=51)] == [51]

    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        by_id = {c[0]: c for c in claimed}
        rows = {
            row[0]: row[1:]
            for row in conn.execute(
                "SELECT run_id, attempt, worker_id, lease_token, started_at, ended_at, outcome"
                " FROM runlane.run_attempts"
            )
        }
        assert rows == {
            untouched: (1, "w1", by_id[untouched][1], by_id[untouched][2], ended[untouched],
                        "completed"),
            # Its start went to the claim after the older re-queue: the row
            # takes the attempt's end.
            reclaimed: (1, "w1", by_id[reclaimed][1], ended[reclaimed], ended[reclaimed],
                        "completed"),
        }  # fmt: skip
        # The run never re-queued keeps its attempt on the run.
        (kept,) = attempts_listed(conn, claimed[0][0])
        assert kept[1:3] == (1, "w1") and kept[6] == "completed"
        assert [r[1:3] for r in attempts_listed(conn, reclaimed)] == [(1, "w1"), (2, "w2")]
        assert [r[1:3] for r in attempts_listed(conn, untouched)] == [(1, "w1")]


def test_runs_an_earlier_version_left_without_their_end_come_right_in_0052(
    empty_db_url: str,
) -> None:
    # 0052 relays lanes and notifies streams on writes of finished_at, and
    # checks that a run has it exactly when its status is final. Runs
    # written otherwise before it (by hand: runlane's writers never did)
    # are put right rather than left to fail the check.
    migrate(empty_db_url, up_to=51)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        ids = [
            row[0]
            for row in conn.execute(
                "INSERT INTO runlane.runs (agent, input, max_attempts)"
                " SELECT 'a', '{}', 3 FROM generate_series(1, 3) RETURNING id"
            )
        ]
        ended, pending, done = ids
        conn.execute("UPDATE runlane.runs SET status = 'cancelled' WHERE id = %s", (ended,))
        conn.execute("UPDATE runlane.runs SET finished_at = now() WHERE id = %s", (pending,))
        conn.execute(
            "UPDATE runlane.runs SET status = 'completed', finished_at = '2026-01-01'"
            " WHERE id = %s",
            (done,),
        )
        before = conn.execute("SELECT finished_at FROM runlane.runs WHERE id = %s", (done,))
        done_at = before.fetchone()

    assert [m.version for m in migrate(empty_db_url, up_to=52)] == [52]

    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        rows = {
            row[0]: row[1:]
            for row in conn.execute(
                "SELECT id, status::text, finished_at IS NOT NULL FROM runlane.runs"
            )
        }
        assert rows == {
            ended: ("cancelled", True),
            pending: ("pending", False),
            done: ("completed", True),
        }
        # A run already right keeps its end.
        after = conn.execute("SELECT finished_at FROM runlane.runs WHERE id = %s", (done,))
        assert done_at is not None and after.fetchone() == done_at
        # The run put right is claimed as any pending run.
        (claimed,) = conn.execute(
            "SELECT id FROM runlane.claim_runs('w1', NULL, 1, 30, 60)"
        ).fetchall()
        assert claimed[0] == pending
