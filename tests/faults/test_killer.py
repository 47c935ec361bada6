"""The killer: worker processes SIGKILLed at random while they run thousands
of lane runs. Nothing is lost, nothing runs twice at once.

Four worker processes (``tests/faults/ledger_app.py``) run the "ledger" agent
over 2,000 requests in 200 lanes (``--long``: 10,000 in 1,000), submitted
through LaneService, half before the workers start and half while they
die. A chaos loop SIGKILLs a random worker (among those that have sent a
heartbeat) every 0.2-1 s and starts a replacement. Each attempt writes
fenced rows (a checkpoint, events, effects; heartbeats happen anyway) and,
beside them, an unfenced ledger row, so that every execution is counted.
A trigger logs the last lease expiry granted to each attempt. When every
lane has drained, the chaos stops; lanes paused by a dead run are continued
until nothing is queued; then the invariants of DESIGN.md §3 are checked on
what the database holds, and the figures are printed (docs/reliability.md
quotes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from runlane.errors import LaneRefused
from runlane.lane_service import LaneService
from runlane.lanes import RequestStatus
from tests.faults.ledger_app import create_ledger, scale_backoff, start_worker, worker_env
from tests.support import wait_until

WORKERS = 4
LEASE_SECONDS = 2.0
WORKER_ENV = worker_env(lease_seconds=LEASE_SECONDS, concurrency=10)
TENANT, USER, AGENT = "chaos", "u", "ledger"
ACTIVE = ("pending", "running", "cancel_requested")
# Runs with this many attempts are never exhausted by kills in practice.
MAX_ATTEMPTS = 10


@dataclass(frozen=True)
class Size:
    lanes: int
    per_lane: int
    # The chaos stops when every lane has drained, or after this long.
    chaos_cap_seconds: float
    drain_seconds: float
    # Retry backoff (runlane.backoff_seconds) scaled by this in the test
    # database: 5 s doubling per attempt would leave CI waiting on backoffs.
    backoff_scale: float


CI_SIZE = Size(lanes=200, per_lane=10, chaos_cap_seconds=120, drain_seconds=240, backoff_scale=0.1)
LONG_SIZE = Size(
    lanes=1000, per_lane=10, chaos_cap_seconds=1500, drain_seconds=600, backoff_scale=1.0
)


@dataclass
class Fleet:
    """The worker processes; replaced as they are killed."""

    db_url: str
    log_dir: Path
    rng: random.Random
    live: list[subprocess.Popen[bytes]] = field(default_factory=list)
    dead: list[subprocess.Popen[bytes]] = field(default_factory=list)
    # (pid, time.time() just before SIGKILL)
    kills: list[tuple[int, float]] = field(default_factory=list)
    started: int = 0
    # Chaos ticks when no worker was serving yet.
    idle_ticks: int = 0
    # pid -> time.time() at spawn
    spawned_at: dict[int, float] = field(default_factory=dict)

    def start_one(self) -> None:
        self.started += 1
        log = self.log_dir / f"worker-{self.started:04d}.log"
        proc = start_worker(self.db_url, log, **WORKER_ENV)
        self.spawned_at[proc.pid] = time.time()
        self.live.append(proc)

    async def kill_random(self, serving: set[int]) -> bool:
        """SIGKILLs a random worker among those serving (``serving``: the
        pids that have sent a heartbeat) and starts a replacement. Returns
        False, killing nobody, while every worker is still starting up: a
        process killed before it claims anything tests nothing."""
        candidates = [proc for proc in self.live if proc.pid in serving]
        if not candidates:
            self.idle_ticks += 1
            return False
        victim = self.rng.choice(candidates)
        self.live.remove(victim)
        self.kills.append((victim.pid, time.time()))
        victim.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.wait, 10)
        self.dead.append(victim)
        self.start_one()
        return True

    async def stop(self) -> list[int | None]:
        """SIGTERM to every live worker; returns their exit codes."""
        for proc in self.live:
            proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in self.live:
            try:
                codes.append(await asyncio.to_thread(proc.wait, 30))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def kill_all(self) -> None:
        for proc in self.live + self.dead:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(10)


def request_plan(lane: int, n: int, rng: random.Random) -> dict[str, Any]:
    """Input and max_attempts of request ``n`` of lane ``lane``: mostly short
    runs; some long (a 0.4 s tool call, more likely to be killed); a few that
    fail once (retried with backoff) or always (dead after 2 attempts); and
    every 20th lane allows a single attempt, so a kill leaves its run dead."""
    payload: dict[str, Any] = {
        "lane": lane,
        "n": n,
        "steps": rng.randint(1, 4),
        "step_seconds": round(rng.uniform(0.01, 0.05), 3),
    }
    max_attempts = 1 if lane % 20 == 7 else MAX_ATTEMPTS
    draw = rng.random()
    if draw < 0.01:
        payload["fail_attempts"] = -1
        max_attempts = 2
    elif draw < 0.03:
        payload["fail_attempts"] = 1
        max_attempts = max(max_attempts, 2)
    elif draw < 0.13:
        payload["tool_seconds"] = 0.4
    return {"input": payload, "max_attempts": max_attempts}


async def submit_lane(lanes: LaneService, lane: int, numbers: range, seed: int) -> None:
    rng = random.Random(seed * 100_003 + lane)
    plans = [request_plan(lane, n, rng) for n in range(numbers.stop)]
    for n in numbers:
        await lanes.submit(
            tenant=TENANT,
            user_id=USER,
            agent=AGENT,
            thread_id=f"t{lane}",
            request_id=f"L{lane}-{n}",
            **plans[n],
        )


async def submit_all(lanes: LaneService, size: Size, numbers: range, seed: int) -> None:
    """Each lane's requests in order; lanes spread over 4 submitters."""

    async def submitter(first: int) -> None:
        for lane in range(first, size.lanes, 4):
            await submit_lane(lanes, lane, numbers, seed)

    await asyncio.gather(*(submitter(i) for i in range(4)))


PROGRESS = f"""
SELECT
  (SELECT count(*) FROM runlane.runs WHERE status IN {ACTIVE}) AS active,
  (SELECT count(*) FROM runlane.requests AS q JOIN runlane.lanes AS l ON l.id = q.lane_id
   WHERE q.status = 'queued' AND l.paused_run_id IS NULL AND l.interrupted_run_id IS NULL)
      AS waiting,
  (SELECT count(*) FROM runlane.requests WHERE status = 'queued') AS queued,
  (SELECT count(*) FROM runlane.runs WHERE status = 'completed') AS completed
"""

SAMPLE = f"""
SELECT count(*) FILTER (WHERE n > 1) AS lanes_over_one, coalesce(sum(n), 0) AS active
FROM (SELECT lane_id, count(*) AS n FROM runlane.runs
      WHERE lane_id IS NOT NULL AND status IN {ACTIVE} GROUP BY lane_id) AS s
"""


@dataclass
class Samples:
    taken: int = 0
    lanes_over_one: int = 0
    max_active: int = 0


async def sample_lanes(db_url: str, stop: asyncio.Event, samples: Samples) -> None:
    """Invariant 1 at many moments during the chaos: per lane, at most one
    active run (each sample is one snapshot)."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        while not stop.is_set():
            cur = await conn.execute(SAMPLE)
            row = await cur.fetchone()
            assert row is not None
            samples.taken += 1
            samples.lanes_over_one += int(row[0])
            samples.max_active = max(samples.max_active, int(row[1]))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)


# Every check counts violations; each must be 0.
CHECKS: dict[str, str] = {
    # Invariant 7: a request is dispatched (with its run) or visibly queued.
    "requests neither dispatched with a run nor queued": """
        SELECT count(*) FROM runlane.requests
        WHERE NOT ((status = 'dispatched' AND run_id IS NOT NULL) OR status = 'queued')""",
    "runs not terminal": f"SELECT count(*) FROM runlane.runs WHERE status IN {ACTIVE}",
    "runs neither completed nor dead": """
        SELECT count(*) FROM runlane.runs WHERE status NOT IN ('completed', 'dead')""",
    # Invariant 3: every committed fenced write was made by the attempt that
    # held the lease (the row's attempt number names the writer's token).
    "events written under a stale lease token": """
        SELECT count(*) FROM runlane.run_events AS e
        LEFT JOIN runlane.attempts AS a ON a.run_id = e.run_id AND a.attempt = e.attempt
        WHERE a.lease_token IS NULL OR a.lease_token::text <> e.data ->> 'lease_token'""",
    "effects recorded under a stale lease token": """
        SELECT count(*) FROM runlane.run_effects AS f
        LEFT JOIN runlane.attempts AS a ON a.run_id = f.run_id AND a.attempt = f.attempt
        WHERE a.lease_token IS NULL OR a.lease_token::text <> f.result ->> 'lease_token'""",
    "checkpoints saved under a stale lease token": """
        SELECT count(*) FROM runlane.runs AS r
        LEFT JOIN runlane.attempts AS a
            ON a.run_id = r.id AND a.attempt = (r.checkpoint ->> 'attempt')::int
        WHERE r.checkpoint IS NOT NULL
          AND (a.lease_token IS NULL OR a.lease_token::text <> r.checkpoint ->> 'lease_token')""",
    "completions not written by the run's last attempt": """
        SELECT count(*) FROM runlane.runs AS r
        JOIN runlane.attempts AS a ON a.run_id = r.id AND a.attempt = r.claim_count
        WHERE r.status = 'completed'
          AND (a.outcome <> 'completed' OR a.lease_token::text <> r.output ->> 'lease_token')""",
    "fenced writes by an execution the ledger never saw": """
        SELECT count(*) FROM runlane.run_events AS e
        WHERE NOT EXISTS (SELECT 1 FROM faults.ledger AS l
                          WHERE l.lease_token::text = e.data ->> 'lease_token')""",
    # Invariant 8: gap-free seq.
    "runs whose event seqs have gaps": """
        SELECT count(*) FROM runlane.runs AS r
        WHERE r.last_event_seq <> (SELECT count(*) FROM runlane.run_events AS e
                                   WHERE e.run_id = r.id)
           OR r.last_event_seq <> coalesce((SELECT max(seq) FROM runlane.run_events AS e
                                            WHERE e.run_id = r.id), 0)""",
    # No two attempts of one run at once: a later attempt's execution starts
    # only after every earlier attempt's lease ended (finished, or expired:
    # the last expiry granted), and after its execution ended when known.
    "attempts that started before an earlier attempt's lease ended": """
        SELECT count(*) FROM attempt_spans AS earlier
        JOIN attempt_spans AS later
            ON later.run_id = earlier.run_id AND later.attempt > earlier.attempt
        WHERE later.exec_started_at < earlier.lease_ended_at""",
    "executions that overlapped an earlier attempt's execution": """
        SELECT count(*) FROM attempt_spans AS earlier
        JOIN attempt_spans AS later
            ON later.run_id = earlier.run_id AND later.attempt > earlier.attempt
        WHERE later.exec_started_at < earlier.exec_ended_at""",
    "attempts that never had a lease logged": """
        SELECT count(*) FROM runlane.attempts AS a
        WHERE NOT EXISTS (SELECT 1 FROM faults.lease_log AS g
                          WHERE g.lease_token = a.lease_token)""",
    # Per lane, runs start in request order, one after the other: run n+1 is
    # created after run n ended, and none of its executions starts before
    # every lease and execution of run n ended.
    "lane runs out of request order": """
        SELECT count(*) FROM (
            SELECT r.created_at, r.started_at,
                   lag(r.created_at) OVER w AS prev_created,
                   lag(r.started_at) OVER w AS prev_started,
                   lag(r.finished_at) OVER w AS prev_finished
            FROM runlane.requests AS q JOIN runlane.runs AS r ON r.id = q.run_id
            WINDOW w AS (PARTITION BY q.lane_id ORDER BY q.request_order)) AS o
        WHERE prev_created IS NOT NULL
          AND (created_at <= prev_created OR created_at < prev_finished
               OR started_at <= prev_started)""",
    "lane runs that executed while the previous run's attempt was alive": """
        WITH runs AS (
            SELECT q.lane_id, q.request_order, s.run_id,
                   min(s.exec_started_at) AS first_exec,
                   max(greatest(s.lease_ended_at, s.exec_ended_at)) AS last_alive
            FROM runlane.requests AS q JOIN attempt_spans AS s ON s.run_id = q.run_id
            GROUP BY q.lane_id, q.request_order, s.run_id
        )
        SELECT count(*) FROM (
            SELECT lane_id, run_id, first_exec, lag(run_id) OVER w AS prev_run,
                   lag(last_alive) OVER w AS prev_alive FROM runs
            WINDOW w AS (PARTITION BY lane_id ORDER BY request_order)) AS o
        WHERE first_exec < prev_alive""",
    # Invariant 5: never more claims than max_attempts (no re-queue here).
    "runs claimed more than max_attempts times": """
        SELECT count(*) FROM runlane.runs AS r
        WHERE r.attempts > r.max_attempts OR r.claim_count > r.max_attempts
           OR (SELECT count(*) FROM runlane.attempts AS a WHERE a.run_id = r.id)
              > r.max_attempts
           OR (SELECT count(*) FROM faults.ledger AS l WHERE l.run_id = r.id) > r.max_attempts""",
    # Exhausted runs are dead, and dead runs are exhausted.
    "exhausted runs not dead": """
        SELECT count(*) FROM runlane.runs AS r
        JOIN runlane.attempts AS a ON a.run_id = r.id AND a.attempt = r.claim_count
        WHERE r.attempts = r.max_attempts AND a.outcome <> 'completed' AND r.status <> 'dead'""",
    "dead runs with attempts left": """
        SELECT count(*) FROM runlane.runs
        WHERE status = 'dead' AND attempts < max_attempts""",
    # Every request became exactly one run, and every run came from one.
    "requests without exactly one run": """
        SELECT count(*) FROM runlane.requests AS q
        WHERE (SELECT count(*) FROM runlane.runs AS r WHERE r.request_id = q.id) <> 1""",
    "runs without their request": """
        SELECT count(*) FROM runlane.runs AS r
        WHERE NOT EXISTS (SELECT 1 FROM runlane.requests AS q WHERE q.run_id = r.id)""",
    # An ended attempt is kept by the outcome write or the reaper, in a row
    # or on its run when it was the run's last (migrations 0035, 0050):
    # once every run has ended, each claim left exactly one attempt.
    "runs whose attempts are not all recorded": """
        SELECT count(*) FROM runlane.runs AS r
        WHERE r.claim_count <> (SELECT count(*) FROM runlane.attempts AS a
                                WHERE a.run_id = r.id)""",
    # run_attempts has no foreign key (migration 0027): each row names a
    # stored run, and one of that run's claims.
    "attempts without their run": """
        SELECT count(*) FROM runlane.run_attempts AS a
        LEFT JOIN runlane.runs AS r ON r.id = a.run_id
        WHERE r.id IS NULL OR a.attempt < 1 OR a.attempt > r.claim_count""",
}

# One row per attempt: its lease's end (finished: ended_at; expired: the
# last expiry granted, whichever came first) and its execution in the ledger
# (start; end when the handler got to write it, i.e. it was not killed).
ATTEMPT_SPANS = """
CREATE TEMP VIEW attempt_spans AS
SELECT a.run_id, a.attempt, a.lease_token, a.outcome, a.worker_id,
       a.started_at AS claimed_at, a.ended_at,
       least(a.ended_at, g.last_expires_at) AS lease_ended_at,
       l.started_at AS exec_started_at, l.ended_at AS exec_ended_at, l.pid
FROM runlane.attempts AS a
LEFT JOIN faults.lease_log AS g ON g.lease_token = a.lease_token
LEFT JOIN faults.ledger AS l ON l.lease_token = a.lease_token
"""


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 2),
        "p95": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 2),
        "max": round(ordered[-1], 2),
    }


def _epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def figures(
    sql: psycopg.Connection[Any], fleet: Fleet, samples: Samples, timings: dict[str, float]
) -> dict[str, Any]:
    def one(query: str) -> Any:
        row = sql.execute(query).fetchone()
        assert row is not None
        return row[0]

    killed_at = dict(fleet.kills)
    detect: list[float] = []
    reap_lag = [
        row[0]
        for row in sql.execute(
            "SELECT extract(epoch FROM ended_at - lease_ended_at)::float FROM attempt_spans"
            " WHERE outcome = 'lease_expired'"
        ).fetchall()
    ]
    recover: list[float] = []
    expired_by_kill = expired_other = 0
    rows = sql.execute(
        """
        SELECT s.worker_id, s.ended_at,
               (SELECT min(n.exec_started_at) FROM attempt_spans AS n
                WHERE n.run_id = s.run_id AND n.attempt > s.attempt) AS next_exec
        FROM attempt_spans AS s WHERE s.outcome = 'lease_expired'"""
    ).fetchall()
    for worker_id, reaped_at, next_exec in rows:
        pid = int(worker_id.rsplit(":", 2)[1])
        if pid not in killed_at:
            expired_other += 1
            continue
        expired_by_kill += 1
        detect.append(reaped_at.timestamp() - killed_at[pid])
        if next_exec is not None:
            recover.append(next_exec.timestamp() - killed_at[pid])
    status = dict(sql.execute("SELECT status, count(*) FROM runlane.runs GROUP BY 1").fetchall())
    startup = [
        started.timestamp() - fleet.spawned_at[pid]
        for pid, started in sql.execute("SELECT pid, started_at FROM runlane.workers")
        if pid in fleet.spawned_at
    ]
    return {
        "runs": one("SELECT count(*) FROM runlane.runs"),
        "lanes": one("SELECT count(*) FROM runlane.lanes"),
        "requests": one("SELECT count(*) FROM runlane.requests"),
        "completed": status.get("completed", 0),
        "dead": status.get("dead", 0),
        "kills": len(fleet.kills),
        "workers_started": fleet.started,
        "chaos_ticks_with_no_worker_serving_yet": fleet.idle_ticks,
        "workers_that_claimed_runs": one("SELECT count(DISTINCT worker_id) FROM runlane.attempts"),
        "attempts": one("SELECT count(*) FROM runlane.attempts"),
        "executions_in_ledger": one("SELECT count(*) FROM faults.ledger"),
        "leases_expired_after_a_kill": expired_by_kill,
        "leases_expired_otherwise": expired_other,
        "runs_recovered": one(
            """SELECT count(DISTINCT run_id) FROM attempt_spans
               WHERE outcome = 'lease_expired'
                 AND run_id IN (SELECT id FROM runlane.runs WHERE status = 'completed')"""
        ),
        "runs_executed_more_than_once": one(
            "SELECT count(*) FROM (SELECT run_id FROM faults.ledger GROUP BY 1"
            " HAVING count(*) > 1) AS x"
        ),
        "effects_executed_more_than_once": one(
            "SELECT count(*) FROM (SELECT run_id, key FROM faults.effect_calls GROUP BY 1, 2"
            " HAVING count(*) > 1) AS x"
        ),
        "lanes_continued_after_a_dead_run": int(timings.pop("continued", 0)),
        "seconds_spawn_to_first_heartbeat": _quantiles(startup),
        "seconds_kill_to_lease_reaped": _quantiles(detect),
        "seconds_lease_expiry_to_reaped": _quantiles(reap_lag),
        "seconds_kill_to_next_attempt_running": _quantiles(recover),
        "lane_samples_during_chaos": samples.taken,
        "max_active_runs_in_a_sample": samples.max_active,
        **{k: round(v, 1) for k, v in timings.items()},
    }


def read_logs(log_dir: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("worker-*.log")))


async def continue_paused_lanes(lanes: LaneService, sql: psycopg.Connection[Any]) -> int:
    continued = 0
    for (thread_id,) in sql.execute(
        "SELECT thread_id FROM runlane.lanes WHERE paused_run_id IS NOT NULL"
    ).fetchall():
        with contextlib.suppress(LaneRefused):
            await lanes.continue_lane(tenant=TENANT, user_id=USER, agent=AGENT, thread_id=thread_id)
            continued += 1
    return continued


@pytest.mark.timeout(420)
async def test_killed_workers_lose_nothing_and_never_overlap(
    db_url: str,
    lanes: LaneService,
    sql: psycopg.Connection[Any],
    tmp_path: Path,
    long_mode: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    size = LONG_SIZE if long_mode else CI_SIZE
    seed = int(os.environ.get("RUNLANE_KILLER_SEED", "7"))
    create_ledger(sql)
    scale_backoff(sql, size.backoff_scale)
    # The ledger stamps times with the workers' clock: the database's, here.
    before = time.time()
    db_now = sql.execute("SELECT extract(epoch FROM clock_timestamp())::float").fetchone()
    assert db_now is not None and before - 0.05 < db_now[0] < time.time() + 0.05
    fleet = Fleet(db_url, tmp_path, random.Random(seed))
    samples = Samples()
    stop_sampling = asyncio.Event()
    timings: dict[str, float] = {}
    invisible: list[str] = []
    half = size.per_lane // 2
    began = time.monotonic()
    try:
        await submit_all(lanes, size, range(half), seed)
        timings["seconds_submitting_first_half"] = time.monotonic() - began
        for _ in range(WORKERS):
            fleet.start_one()
        sampler = asyncio.create_task(sample_lanes(db_url, stop_sampling, samples))
        late_submissions = asyncio.create_task(
            submit_all(lanes, size, range(half, size.per_lane), seed)
        )

        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:

            async def drained() -> bool:
                cur = await conn.execute(PROGRESS)
                row = await cur.fetchone()
                assert row is not None
                return late_submissions.done() and row[0] == 0 and row[1] == 0

            chaos_began = time.monotonic()
            deadline = chaos_began + size.chaos_cap_seconds
            rng = random.Random(seed)
            while time.monotonic() < deadline:
                await asyncio.sleep(rng.uniform(0.2, 1.0))  # the fault schedule
                if await drained():
                    break
                cur = await conn.execute("SELECT pid FROM runlane.workers WHERE stopped_at IS NULL")
                await fleet.kill_random({pid for (pid,) in await cur.fetchall()})
            timings["seconds_of_chaos"] = time.monotonic() - chaos_began
            cur = await conn.execute(PROGRESS)
            row = await cur.fetchone()
            assert row is not None
            timings["runs_completed_during_chaos"] = row[3]
            await late_submissions
            stop_sampling.set()
            await sampler

            # Invariant 7 right after the chaos: what is not dispatched is
            # visibly queued, with its position, behind a paused lane's head.
            queued = 0
            cur = await conn.execute(
                "SELECT request_id FROM runlane.requests WHERE status = 'queued'"
            )
            for (request_id,) in await cur.fetchall():
                request = await lanes.get_request(tenant=TENANT, request_id=request_id)
                # The workers still drain while this loop reads: a request
                # dispatched since the list was taken has no position, and
                # rightly so. One still queued when read must have one.
                if request.status is RequestStatus.QUEUED and (
                    request.position is None or request.position < 1
                ):
                    invisible.append(request_id)
                queued += 1
            timings["requests_queued_when_chaos_ended"] = queued

            # Lanes paused by a dead run: continue them until nothing waits.
            continued = 0

            async def settled() -> bool:
                nonlocal continued
                if not await drained():
                    return False
                cur = await conn.execute(PROGRESS)
                row = await cur.fetchone()
                assert row is not None
                if row[2] == 0:
                    return True
                continued += await continue_paused_lanes(lanes, sql)
                return False

            drain_began = time.monotonic()
            await wait_until(
                settled, timeout=size.drain_seconds, interval=0.3, message="every lane drained"
            )
            timings["seconds_draining_after_chaos"] = time.monotonic() - drain_began
            timings["continued"] = continued
        codes = await fleet.stop()
        timings["seconds_total"] = time.monotonic() - began
    finally:
        stop_sampling.set()
        fleet.kill_all()

    assert all(code == 0 for code in codes), f"workers exited with {codes}"
    sql.execute(ATTEMPT_SPANS)
    violations = {
        name: sql.execute(query).fetchone()[0]  # type: ignore[index]
        for name, query in CHECKS.items()
    }
    details = {
        name: sql.execute(
            CHECKS[name].replace("SELECT count(*)", "SELECT *", 1) + " LIMIT 5"
        ).fetchall()
        for name, count in violations.items()
        if count
    }
    violations["lanes with two active runs in a sample"] = samples.lanes_over_one
    violations["queued requests without a position after the chaos"] = len(invisible)
    index = sql.execute(
        "SELECT indisunique AND indisvalid FROM pg_index"
        " WHERE indexrelid = 'runlane.runs_one_active_per_lane_idx'::regclass"
    ).fetchone()
    violations["unique index runs_one_active_per_lane_idx missing or invalid"] = int(
        index != (True,)
    )
    logs = read_logs(tmp_path)
    for needle in ("runs_one_active_per_lane_idx", "UniqueViolation", "unexpected error"):
        violations[f"worker log lines with {needle!r}"] = logs.count(needle)

    report = figures(sql, fleet, samples, timings)
    report["error_lines_in_worker_logs"] = sum(" ERROR " in line for line in logs.splitlines())
    report["violations"] = sum(violations.values())
    with capsys.disabled():
        print(f"\nkiller ({'long' if long_mode else 'CI'} size, seed {seed}):")
        print(json.dumps(report, indent=1, default=str))
        for name, rows in details.items():
            print(f"violation {name!r}, examples:")
            for row in rows:
                print(f"  {row}")
                for run_id in {v for v in row if isinstance(v, UUID)}:
                    for span in sql.execute(
                        "SELECT * FROM attempt_spans WHERE run_id = %s ORDER BY attempt", (run_id,)
                    ):
                        print(f"    {span}")
    assert {k: v for k, v in violations.items() if v} == {}
    assert report["runs"] == size.lanes * size.per_lane
    assert report["kills"] >= 10, "the chaos should have killed workers"
    assert report["leases_expired_after_a_kill"] > 0, "kills should have cut runs mid-flight"
