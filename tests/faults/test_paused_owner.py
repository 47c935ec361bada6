"""A paused owner: a worker process SIGSTOPped while it holds runs, for
longer than their lease. Another worker takes them over; when the paused
one is continued (SIGCONT) it writes nothing that sticks, notices that it
lost the leases, and stops those runs.

Both workers are ``tests/faults/ledger_app.py`` processes: every fenced
write carries the writer's lease token and pid, and an unfenced ledger
counts every execution (see that module).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from runlane.database import create_pool
from runlane.lane_service import LaneService
from runlane.models import Outcome
from runlane.service import RunService
from runlane.store import REAPER_LOCK_KEY, RunStore
from tests.faults.ledger_app import create_ledger, scale_backoff, start_worker, worker_env
from tests.support import wait_until

LEASE_SECONDS = 4.0
WORKER_ENV = worker_env(lease_seconds=LEASE_SECONDS, concurrency=4)
# Advisory locks held in this test's database (maintenance jobs hold one
# while they work).
ADVISORY_LOCKS = """
SELECT count(*) FROM pg_locks
WHERE locktype = 'advisory' AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def one(sql: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = sql.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def worker_pid(worker_id: str | None) -> int | None:
    return None if worker_id is None else int(worker_id.rsplit(":", 2)[1])


def stop_processes(*procs: subprocess.Popen[bytes] | None) -> None:
    for proc in procs:
        if proc is None:
            continue
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(10)


async def sigstop_outside_maintenance(
    proc: subprocess.Popen[bytes], sql: psycopg.Connection[Any]
) -> None:
    """SIGSTOPs ``proc`` at a moment it holds no maintenance lock (see
    test_paused_worker_holding_the_reaper_lock_stalls_recovery)."""
    for _ in range(100):
        os.kill(proc.pid, signal.SIGSTOP)
        if one(sql, ADVISORY_LOCKS) == 0:
            return
        os.kill(proc.pid, signal.SIGCONT)
        await wait_until(lambda: one(sql, ADVISORY_LOCKS) == 0, timeout=5, message="lock freed")
    raise AssertionError("could not stop the worker outside its maintenance jobs")


async def test_paused_owner_writes_nothing_that_sticks_and_stops_its_runs(
    db_url: str,
    service: RunService,
    lanes: LaneService,
    sql: psycopg.Connection[Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    create_ledger(sql)
    # Backoff after the reaped lease: 0.5 s instead of 5 s.
    scale_backoff(sql, 0.1)
    # Three runs: one working in short steps (a safe point and fenced writes
    # each); one that, 0.5 s in, blocks the whole process in a synchronous
    # 1.5 s "tool call" (the pause lands inside it) and then returns, so the
    # first thing the worker does when it resumes is write that completion;
    # and a lane's run with a request queued behind it.
    stepper, _ = await service.submit("ledger", {"steps": 100, "step_seconds": 0.05})
    blocker, _ = await service.submit(
        "ledger",
        {
            "blocking_seconds": 1.5,
            "block_after_seconds": 0.5,
            "blocking_marker": str(tmp_path / "blocking"),
            "steps": 3,
        },
    )
    lane = {"tenant": "acme", "user_id": "ann", "agent": "ledger", "thread_id": "paused"}
    head, _ = await lanes.submit(
        **lane, request_id="head", input={"steps": 100, "step_seconds": 0.05}
    )
    behind, _ = await lanes.submit(**lane, request_id="behind", input={"steps": 2})
    assert head.run_id is not None and behind.run_id is None
    run_ids: list[UUID] = [stepper.id, blocker.id, head.run_id]

    def held_by(pid: int, *, attempt: int, done: tuple[str, ...] = ()) -> bool:
        """Every run is in ``attempt`` by worker ``pid``, which has written
        events; the status is running (or one of ``done``)."""
        rows = sql.execute(
            "SELECT worker_id, claim_count, status,"
            " (SELECT count(*) FROM runlane.run_events AS e"
            "  WHERE e.run_id = r.id AND e.attempt = r.claim_count)"
            " FROM runlane.runs AS r WHERE id = ANY(%s)",
            (run_ids,),
        ).fetchall()
        return all(
            (worker_pid(w) == pid or s in done)
            and n == attempt
            and (s == "running" or s in done)
            and events > 0
            for w, n, s, events in rows
        )

    old = start_worker(db_url, tmp_path / "old.log", **WORKER_ENV)
    new: subprocess.Popen[bytes] | None = None
    try:
        await wait_until(
            lambda: held_by(old.pid, attempt=1) and (tmp_path / "blocking").exists(),
            timeout=30,
            interval=0.01,
            message="the old worker working, blocked in the tool call",
        )
        old_tokens = dict(
            sql.execute(
                "SELECT id, lease_token FROM runlane.runs WHERE id = ANY(%s)", (run_ids,)
            ).fetchall()
        )
        await sigstop_outside_maintenance(old, sql)
        stopped_at = time.time()

        # Another worker takes every run over once its lease has expired.
        new = start_worker(db_url, tmp_path / "new.log", **WORKER_ENV)
        await wait_until(
            lambda: held_by(new.pid, attempt=2, done=("completed",)),
            timeout=30,
            message="the new worker took over",
        )
        assert time.time() - stopped_at > LEASE_SECONDS
        os.kill(old.pid, signal.SIGCONT)
        resumed_at = time.time()

        # The old worker notices: each of its attempts ends (the handler's
        # own ledger row closes), its log says why, and its heartbeat reports
        # only the leases it holds (none of these three; once alive again it
        # may claim new work, such as the lane's next run).
        await wait_until(
            lambda: one(
                sql,
                "SELECT count(*) = 3 FROM faults.ledger"
                " WHERE pid = %s AND run_id = ANY(%s) AND ended_at IS NOT NULL",
                old.pid,
                run_ids,
            ),
            timeout=15,
            message="the old worker's attempts stopped",
        )

        def lease_loss_logged() -> bool:
            lines = (tmp_path / "old.log").read_text().splitlines()
            return all(
                any(f"run {run_id}:" in line and "lease" in line for line in lines)
                for run_id in run_ids
            )

        await wait_until(lease_loss_logged, timeout=15, message="lease loss in the old log")
        # The blocked run returned on resuming: its completion was either
        # sent and refused (another attempt holds the lease), or not sent at
        # all because the watchdog had already called the lease lost,
        # depending on which the event loop ran first.
        old_log = (tmp_path / "old.log").read_text()
        assert (
            f"run {blocker.id}: lease lost before completed was recorded" in old_log
            or f"run {blocker.id}: lease ran out before completed was recorded" in old_log
        )
        await wait_until(
            lambda: one(
                sql,
                "SELECT w.last_seen_at > to_timestamp(%s) AND w.running = (SELECT count(*)"
                "  FROM runlane.runs AS r WHERE r.worker_id = w.id AND NOT r.id = ANY(%s))"
                " FROM runlane.workers AS w WHERE w.pid = %s",
                resumed_at,
                run_ids,
                old.pid,
            ),
            timeout=15,
            message="the old worker's heartbeat without those leases",
        )

        # The new worker finishes them; the lane then runs the request behind.
        await wait_until(
            lambda: one(
                sql,
                "SELECT count(*) = 4 FROM runlane.runs WHERE status = 'completed'",
            ),
            timeout=60,
            message="every run completed",
        )
        assert old.poll() is None, "the paused worker should have carried on"
    finally:
        stop_processes(old, new)

    # Nothing the old worker wrote after the takeover stuck: each fenced row
    # carrying its token (or pid) was committed while it held the lease.
    late_rows = one(
        sql,
        """
        SELECT count(*) FROM (
            SELECT e.run_id, e.data, e.created_at, e.attempt FROM runlane.run_events AS e
            UNION ALL
            SELECT f.run_id, f.result, f.created_at, f.attempt FROM runlane.run_effects AS f
        ) AS w
        JOIN runlane.attempts AS taken ON taken.run_id = w.run_id AND taken.attempt = 2
        WHERE (w.data ->> 'pid')::int = %s AND w.run_id = ANY(%s)
          AND (w.attempt <> 1 OR w.created_at >= taken.started_at)""",
        old.pid,
        run_ids,
    )
    assert late_rows == 0
    assert (
        one(
            sql,
            "SELECT count(*) FROM runlane.run_events WHERE (data ->> 'pid')::int = %s"
            " AND run_id = ANY(%s) AND created_at >= to_timestamp(%s)",
            old.pid,
            run_ids,
            resumed_at,
        )
        == 0
    )
    # No effect ran again after the resume: the fenced write before it was refused.
    assert (
        one(
            sql,
            "SELECT count(*) FROM faults.effect_calls"
            " WHERE pid = %s AND run_id = ANY(%s) AND at >= to_timestamp(%s)",
            old.pid,
            run_ids,
            resumed_at,
        )
        == 0
    )
    # The old worker's handlers were stopped (lease lost, or cancelled by the
    # watchdog); only the blocked one returned, and its completion was refused.
    endings = dict(
        sql.execute(
            "SELECT run_id, how FROM faults.ledger WHERE pid = %s AND run_id = ANY(%s)",
            (old.pid, run_ids),
        ).fetchall()
    )
    assert endings.pop(blocker.id) == "returned"
    assert set(endings.values()) <= {"LeaseLost", "CancelledError"}

    for run_id in run_ids:
        run = await service.get(run_id)
        attempts = await service.attempts(run_id)
        assert [(worker_pid(a.worker_id), a.outcome) for a in attempts] == [
            (old.pid, "lease_expired"),
            (new.pid, "completed"),
        ]
        assert run.output["pid"] == new.pid and run.output["attempt"] == 2
        assert run.output["lease_token"] == str(attempts[1].lease_token)
        assert str(old_tokens[run_id]) == str(attempts[0].lease_token)
        assert run.checkpoint["lease_token"] == str(attempts[1].lease_token)
        events = await service.events(run_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert all(
            e.data["lease_token"] == str(attempts[e.attempt - 1].lease_token) for e in events
        )

    # Whatever the old worker could still send with its tokens is refused:
    # the completion, an event, an effect, a checkpoint, a renewal.
    pool = create_pool(db_url, min_size=1, max_size=1)
    await pool.open()
    try:
        stale = RunStore(pool)
        for run_id, token in old_tokens.items():
            assert await stale.append_event(run_id, token, "late", {"pid": old.pid}) is None
            assert await stale.record_effect(run_id, token, "late", {"pid": old.pid}) == (
                False,
                None,
            )
            assert await stale.save_checkpoint(run_id, token, {"pid": old.pid}) is False
            assert await stale.renew_leases([(run_id, token)], lease_seconds=60) == {}
            assert await stale.finish_attempt(run_id, token, Outcome.COMPLETED) is None
    finally:
        await pool.close()
    for run_id in run_ids:
        run = await service.get(run_id)
        assert run.status.value == "completed" and run.output["pid"] == new.pid

    # The lane: the request behind ran after the head, which the new worker ended.
    head_run = await service.get(head.run_id)
    behind_now = await lanes.get_request(tenant="acme", request_id="behind")
    assert behind_now.run_id is not None
    behind_run = await service.get(behind_now.run_id)
    assert head_run.finished_at is not None and behind_run.created_at >= head_run.finished_at

    noticed = [
        line.split(" WARNING ", 1)[1]
        for line in (tmp_path / "old.log").read_text().splitlines()
        if " WARNING " in line and any(str(r) in line for r in run_ids)
    ]
    with capsys.disabled():
        print(f"\npaused owner: paused {resumed_at - stopped_at:.1f} s (lease {LEASE_SECONDS} s);")
        print("the old worker's log after SIGCONT:")
        for line in noticed:
            print(f"  {line}")


def reaper_lock_held(sql: psycopg.Connection[Any]) -> bool:
    return bool(
        one(
            sql,
            ADVISORY_LOCKS + " AND classid::bigint = %s AND objid::bigint = %s",
            REAPER_LOCK_KEY >> 32,
            REAPER_LOCK_KEY & 0xFFFFFFFF,
        )
    )


async def sigstop_inside_a_reaper_sweep(
    proc: subprocess.Popen[bytes], sql: psycopg.Connection[Any]
) -> None:
    """SIGSTOPs ``proc`` while its reaper holds the reaper's advisory lock
    (a sweep lasts milliseconds: watch for it, stop, check, else retry)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not reaper_lock_held(sql):
            continue
        os.kill(proc.pid, signal.SIGSTOP)
        if reaper_lock_held(sql):
            return
        os.kill(proc.pid, signal.SIGCONT)
    raise AssertionError("never caught the worker inside a reaper sweep")


async def test_paused_worker_holding_the_reaper_lock_does_not_stall_recovery(
    db_url: str, service: RunService, sql: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """A worker paused in the middle of a reaper sweep (a GC pause, a frozen
    VM, SIGSTOP; or a connection black-holed then) holds the reaper's
    advisory lock. The server disconnects the frozen holder after the lock's
    bounded idle time, so another worker reaps its expired leases and runs
    its runs again while it is still paused (found by this test: with a
    plain session lock the runs stayed ``running`` for the whole pause)."""
    create_ledger(sql)
    scale_backoff(sql, 0.1)
    run, _ = await service.submit("ledger", {"steps": 1000, "step_seconds": 0.05})
    old = start_worker(db_url, tmp_path / "old.log", **WORKER_ENV)
    new: subprocess.Popen[bytes] | None = None
    try:
        await wait_until(
            lambda: one(sql, "SELECT last_event_seq > 0 FROM runlane.runs"),
            timeout=30,
            message="the run working",
        )
        await sigstop_inside_a_reaper_sweep(old, sql)
        new = start_worker(db_url, tmp_path / "new.log", **WORKER_ENV)
        # Another worker should reap the expired lease and run the run again.
        await wait_until(
            lambda: one(sql, "SELECT claim_count > 1 FROM runlane.runs WHERE id = %s", run.id),
            timeout=LEASE_SECONDS + 10,
            message="the run taken over by the new worker",
        )
    finally:
        stop_processes(old, new)
