"""Data access for the run queue: the only module that runs runlane's SQL.

Every method is one statement (or one short transaction) from
``sql/queries.sql``; the service layer and the worker build on these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection, AsyncCursor
from psycopg.rows import DictRow, RowMaker, tuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from runlane.database import jsonb_param
from runlane.errors import LaneRefused
from runlane.maintenance_lock import maintenance_lock
from runlane.models import (
    TERMINAL_STATUSES,
    Attempt,
    ClaimedRun,
    Event,
    LeaseState,
    Outcome,
    Run,
    RunStatus,
)
from runlane.queries import named_queries

# Maintenance jobs (reaper, recovery, pruner) each take their own key, so
# one process at a time does each job.
REAPER_LOCK_KEY = 0x726C5F7265617065
PRUNER_LOCK_KEY = 0x726C5F7072756E

# How long a stopped or gone worker stays listed before the pruner deletes
# its row.
WORKER_FORGET_SECONDS = 3600.0

# The statuses runs_exceptional_listing_idx holds (its predicate, migrations
# 0021 and 0029): a listing of these alone reads that index.
EXCEPTIONAL_STATUSES = frozenset(
    {RunStatus.FAILED, RunStatus.DEAD, RunStatus.CANCELLED, RunStatus.INTERRUPTED}
)


# The statuses of runs not yet finished, each read through a partial index
# of its own (list_live_runs).
LIVE_STATUSES = frozenset(RunStatus) - TERMINAL_STATUSES


def listing_query(
    statuses: Sequence[RunStatus] | None, *, tenant: str | None = None, user_id: str | None = None
) -> str:
    """The named query that lists runs of these statuses (any when None),
    for a set that one query lists (see listing_parts): the tenant's runs,
    or without a tenant every tenant's (of the owner, if given)."""
    if statuses and set(statuses) <= EXCEPTIONAL_STATUSES:
        return (
            "list_exceptional_runs"
            if tenant is not None
            else "list_exceptional_runs_of_every_tenant"
        )
    if statuses and set(statuses) <= LIVE_STATUSES:
        return "list_live_runs"
    if tenant is None and user_id is None:
        return "list_runs_of_every_tenant"
    return "list_runs"


def listing_parts(statuses: Sequence[RunStatus] | None) -> list[list[RunStatus] | None]:
    """The statuses split into sets that one query each lists without
    reading the history; a page of them all is the newest of those
    queries' pages.

    list_runs walks a tenant's runs newest first, which finds a page fast
    only where the statuses asked for are common. Completed runs are; with
    them asked for (or no status), one walk does. Without them, the live
    statuses and the exceptional ones are each read through indexes that
    hold only their runs (list_live_runs, list_exceptional_runs). Read as
    one walk, a page of live runs mixed with failed or dead ones, among
    300,000 finished runs, took 0.46-0.9 s (thirty-first session,
    BENCHMARKS.md section 4); a part per kind, 1-2 ms.
    """
    if not statuses or RunStatus.COMPLETED in statuses:
        return [list(statuses) if statuses else None]
    chosen = sorted(set(statuses))
    parts: list[list[RunStatus] | None] = []
    for kind in (LIVE_STATUSES, EXCEPTIONAL_STATUSES):
        if part := [s for s in chosen if s in kind]:
            parts.append(part)
    return parts


def _status_texts(statuses: Sequence[RunStatus] | None) -> list[str] | None:
    return [str(s) for s in statuses] if statuses else None


def _json(value: Any) -> Jsonb | None:
    return None if value is None else Jsonb(value)


def _float(value: float | None) -> float | None:
    """A number for a binary float8 array, whose elements psycopg dumps
    with the first element's dumper: an int among floats (a delay given as
    ``5``) would not dump."""
    return None if value is None else float(value)


def _null_if_all_null(values: list[Any]) -> list[Any] | None:
    """An outcome batch's column that holds only NULLs (most batches have
    no errors, delays or interrupts) goes as one NULL array: the multi-array
    unnest() of finish_attempts pads it with NULLs, and neither psycopg nor
    PostgreSQL handles its elements one by one."""
    for value in values:
        if value is not None:
            return values
    return None


@dataclass(frozen=True, slots=True)
class NewRun:
    agent: str
    input: Any
    max_attempts: int
    tenant: str = "default"
    user_id: str = "default"
    priority: int = 0
    delay_seconds: float = 0.0
    budget: dict[str, Any] | None = None
    idempotency_key: str | None = None
    metadata: dict[str, Any] | None = None
    # The input's and the metadata's JSON in UTF-8 when already made (see
    # database.jsonb_param); else they are serialized here.
    input_json: bytes | None = None
    metadata_json: bytes | None = None

    @property
    def query(self) -> str:
        """The named query that inserts it: a run with no idempotency key
        may go to a parked worker, one with a key may find its earlier run."""
        return "insert_run" if self.idempotency_key is None else "insert_run_with_key"

    def params(self, *, notify: bool) -> dict[str, Any]:
        """The parameters of its query (``query``); ``notify``: whether a
        run available now sends the wake-up NOTIFY."""
        return {
            "tenant": self.tenant,
            "user_id": self.user_id,
            "agent": self.agent,
            "input": jsonb_param(self.input, self.input_json),
            "priority": self.priority,
            "delay_seconds": float(self.delay_seconds),
            "max_attempts": self.max_attempts,
            "budget": Jsonb(self.budget or {}),
            "idempotency_key": self.idempotency_key,
            "metadata": jsonb_param(self.metadata or {}, self.metadata_json),
            "notify": notify,
        }


# Statements that join runs to a batch given as arrays are never prepared.
# psycopg prepares a statement run more than five times, and PostgreSQL then
# keeps one plan for it, made for the table as it was: a join of the batch
# to runs planned while runs held ~140 rows used a sequential scan of runs
# and kept doing so at 30,000 rows (the outcome write took 30-40 ms per
# batch that way before migration 0015 moved it into a function with pinned
# plans). Unprepared, each execution is planned for its batch and the table
# as it is now. Setting plan_cache_mode for the whole session instead also
# re-planned every foreign-key check and trigger statement per row (in its
# benchmark sweep, PostgreSQL CPU per run at concurrency 10 was 0.51 ms
# against 0.37 ms in the sweep before).
_UNPREPARED = frozenset({"renew_leases"})


def _prepare(name: str) -> bool | None:
    """psycopg's ``prepare`` for the named query: False for _UNPREPARED,
    else its default (prepare after five runs)."""
    return False if name in _UNPREPARED else None


# Not frozen: built once per attempt on the worker's hot path, where a
# frozen dataclass's field-by-field object.__setattr__ cost 2.8 us of it
# (0.4 us without).
@dataclass(slots=True)
class Finish:
    """How one attempt ends (see the finish_attempts query)."""

    run_id: UUID
    lease_token: UUID
    outcome: Outcome
    output: Any = None
    error: dict[str, Any] | None = None
    retry_delay_seconds: float | None = None
    interrupt: Any = None
    interrupt_expires_in: float | None = None
    # The run's lane (None for a direct run): finish_attempts_status locks
    # the lanes of a batch before its runs.
    lane_id: int | None = None


@dataclass(frozen=True, slots=True)
class EventAppend:
    """One event for a run's stream, fenced by its attempt's lease token
    (see the append_events query). ``data`` is already redacted."""

    run_id: UUID
    lease_token: UUID
    kind: str
    data: Any


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    """What a worker claims: up to ``limit`` runs of ``agents`` (None: any
    agent) with a lease of ``lease_seconds``; ``aging_seconds``: one
    priority point per that many seconds waited (0: no aging).

    ``unpark``: withdraw the worker's standing claim first; the run a
    submit gave it comes back too (``ClaimedRun.pushed``), else the claim
    takes up to one run more (the slot the standing claim held).
    ``park_seconds``: if the claim comes back short, leave a standing claim
    that submits fill for that long (migration 0025)."""

    worker_id: str
    limit: int
    lease_seconds: float
    agents: Sequence[str] | None = None
    aging_seconds: float = 0.0
    unpark: bool = False
    park_seconds: float | None = None

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "worker_id": self.worker_id,
            "limit": self.limit,
            "lease_seconds": float(self.lease_seconds),
            "agents": list(self.agents) if self.agents is not None else None,
            "aging_seconds": float(self.aging_seconds),
        }
        if self.unpark or self.park_seconds is not None:
            params["unpark"] = self.unpark
            params["park_seconds"] = None if self.park_seconds is None else float(self.park_seconds)
        return params


@dataclass(frozen=True, slots=True)
class PushedRun:
    """A run a submit gave a worker's standing claim (migration 0025):
    already claimed by that worker under ``lease_token``."""

    run_id: UUID
    lease_token: UUID


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """How a worker shows up in runlane.workers."""

    id: str
    hostname: str
    pid: int
    agents: list[str] | None
    concurrency: int


@dataclass(frozen=True, slots=True)
class RunCursor:
    """Where a newest-first listing stopped."""

    created_at: datetime
    run_id: UUID


class RunStore:
    """Named queries over a connection pool.

    ``notify=False`` sends no NOTIFY at all: workers must then progress by
    polling alone (DESIGN.md §3.9), which the tests check.
    """

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[DictRow]], *, notify: bool = True):
        self.pool = pool
        self.notify = notify
        self._sql = named_queries()

    async def _fetch_all(self, name: str, params: dict[str, Any]) -> list[DictRow]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(self._sql[name], params, prepare=_prepare(name))
            return await cur.fetchall()

    async def _fetch_one(self, name: str, params: dict[str, Any]) -> DictRow | None:
        rows = await self._fetch_all(name, params)
        return rows[0] if rows else None

    # -- runs -------------------------------------------------------------

    async def insert_run(self, new: NewRun) -> tuple[Run, bool]:
        """Inserts a run; with an idempotency key already used, returns that
        run instead. The bool says whether this call created it."""
        params = new.params(notify=self.notify)
        # A concurrent insert of the same key can commit after this
        # statement's snapshot: then neither branch sees a row, and a second
        # try (new snapshot) finds it.
        for _ in range(3):
            row = await self._fetch_one(new.query, params)
            if row is not None:
                return Run.from_row(row), bool(row["created"])
        raise RuntimeError(f"{new.query} found neither a new nor an existing run")

    async def get_run(self, run_id: UUID) -> Run | None:
        row = await self._fetch_one("get_run", {"run_id": run_id})
        return Run.from_row(row) if row else None

    async def list_runs(
        self,
        *,
        tenant: str | None = None,
        user_id: str | None = None,
        thread_id: str | None = None,
        statuses: Sequence[RunStatus] | None = None,
        agent: str | None = None,
        after: RunCursor | None = None,
        limit: int = 50,
    ) -> list[Run]:
        params = {
            "tenant": tenant,
            "user_id": user_id,
            "thread_id": thread_id,
            "agent": agent,
            "before_created_at": after.created_at if after else None,
            "before_id": after.run_id if after else None,
            "limit": limit,
        }
        parts = listing_parts(statuses)
        if len(parts) == 1:
            rows = await self._fetch_all(
                listing_query(parts[0], tenant=tenant, user_id=user_id),
                {**params, "statuses": _status_texts(parts[0])},
            )
            return [Run.from_row(row) for row in rows]
        rows = []
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(self._sql["read_one_snapshot"])
            for part in parts:
                cur = await conn.execute(
                    self._sql[listing_query(part, tenant=tenant, user_id=user_id)],
                    {**params, "statuses": _status_texts(part)},
                )
                rows += await cur.fetchall()
        # The parts list disjoint statuses, each newest first: the page is
        # the newest of them all, in the queries' order (uuids compare as
        # PostgreSQL compares them, byte by byte).
        rows.sort(key=lambda row: (row["created_at"], row["id"]), reverse=True)
        return [Run.from_row(row) for row in rows[:limit]]

    async def count_runs_by_status(self, *, tenant: str | None = None) -> dict[RunStatus, int]:
        rows = await self._fetch_all("count_runs_by_status", {"tenant": tenant})
        return {RunStatus(row["status"]): int(row["count"]) for row in rows}

    async def request_cancel(self, run_id: UUID) -> Run | None:
        """Cancels a pending or interrupted run, or records cancel intent on a
        running one. Returns the run as it now is (unchanged if it had ended)."""
        async with self.pool.connection() as conn, conn.transaction():
            await self._lock_lane_of_run(conn, run_id)
            cur = await conn.execute(
                self._sql["request_cancel"], {"run_id": run_id, "notify": self.notify}
            )
            row = await cur.fetchone()
        return Run.from_row(row) if row else None

    async def requeue_run(self, run_id: UUID) -> tuple[Run | None, bool]:
        """Re-queues a failed or dead run. A lane's run becomes its lane's
        active run again (refused by the unique index if another is active)
        and lifts the pause it caused."""
        async with self.pool.connection() as conn, conn.transaction():
            lane = await self._lock_lane_of_run(conn, run_id)
            if lane is not None:
                # Re-queueing an older run must not bypass the lane's state.
                if lane["interrupted_run_id"] is not None:
                    raise LaneRefused(
                        "run_interrupted", "the run's lane waits for an interrupted run"
                    )
                if lane["paused_run_id"] not in (None, run_id):
                    raise LaneRefused(
                        "lane_paused",
                        f"the run's lane is paused by run {lane['paused_run_id']};"
                        " continue the lane or re-queue that run",
                    )
            cur = await conn.execute(
                self._sql["requeue_run"], {"run_id": run_id, "notify": self.notify}
            )
            row = await cur.fetchone()
            if row is None:
                return None, False
            if row["requeued"] and row["lane_id"] is not None:
                await conn.execute(
                    self._sql["unpause_lane_for_run"],
                    {"lane_id": row["lane_id"], "run_id": run_id},
                )
        return Run.from_row(row), bool(row["requeued"])

    async def _lock_lane_of_run(
        self, conn: AsyncConnection[DictRow], run_id: UUID
    ) -> DictRow | None:
        """Lane before run: every writer of a lane's run takes the lane lock
        first, so the relay trigger never waits on it (no deadlocks).
        Returns the lane's row, None for a direct run."""
        cur = await conn.execute(self._sql["lock_lane_of_run"], {"run_id": run_id})
        return await cur.fetchone()

    async def list_attempts(self, run_id: UUID) -> list[Attempt]:
        rows = await self._fetch_all("list_attempts", {"run_id": run_id})
        return [Attempt.from_row(row) for row in rows]

    async def list_events(
        self, run_id: UUID, *, after_seq: int = 0, limit: int = 1000
    ) -> list[Event]:
        rows = await self._fetch_all(
            "list_events", {"run_id": run_id, "after_seq": after_seq, "limit": limit}
        )
        return [Event.from_row(row) for row in rows]

    # -- worker side ------------------------------------------------------

    async def claim_batch(
        self,
        *,
        worker_id: str,
        limit: int,
        lease_seconds: float,
        agents: Sequence[str] | None = None,
        aging_seconds: float = 0.0,
    ) -> list[ClaimedRun]:
        """Claims up to ``limit`` runs of ``agents`` (None: any agent).
        ``aging_seconds``: one priority point per that many seconds waited."""
        return await self.claim(ClaimSpec(worker_id, limit, lease_seconds, agents, aging_seconds))

    async def claim(self, spec: ClaimSpec) -> list[ClaimedRun]:
        """Claims as ``spec`` says (see ClaimSpec): one statement."""
        if spec.agents is not None and not spec.agents and not spec.unpark:
            return []
        async with self.pool.connection() as conn:
            cur = await self._send_claim(conn, spec)
            return await cur.fetchall()

    async def unpark(self, worker_id: str) -> PushedRun | None:
        """Withdraws the worker's standing claim; answers the run a submit
        gave it, if any."""
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(self._sql["unpark_worker"], {"worker_id": worker_id})
            row = await cur.fetchone()
        if row is None or row[0] is None:
            return None
        return PushedRun(row[0], row[1])

    async def get_pushed_run(self, pushed: PushedRun) -> ClaimedRun | None:
        """The pushed run as a claim answers it; None once that attempt has
        ended or lost its lease."""
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=_claimed_run_row)
            await cur.execute(
                self._sql["get_pushed_run"],
                {"run_id": pushed.run_id, "lease_token": pushed.lease_token},
            )
            return await cur.fetchone()

    async def _send_claim(
        self, conn: AsyncConnection[DictRow], spec: ClaimSpec
    ) -> AsyncCursor[ClaimedRun]:
        """Sends the claim on ``conn``; its cursor answers the claimed runs
        (at once, or in a pipeline once the pipeline has synced)."""
        cur = conn.cursor(row_factory=_claimed_run_row)
        if spec.unpark or spec.park_seconds is not None:
            await cur.execute(self._sql["claim_or_park"], spec.params())
        else:
            await cur.execute(
                self._sql["claim_batch"], spec.params(), prepare=_prepare("claim_batch")
            )
        return cur

    async def set_tenant_limit(self, tenant: str, max_running: int | None) -> None:
        """Caps a tenant's running runs; None removes the cap."""
        if max_running is None:
            await self._fetch_all("clear_tenant_limit", {"tenant": tenant})
        else:
            await self._fetch_all(
                "set_tenant_limit", {"tenant": tenant, "max_running": max_running}
            )

    async def list_tenant_limits(self, tenant: str | None = None) -> list[DictRow]:
        return await self._fetch_all("list_tenant_limits", {"tenant": tenant})

    async def renew_leases(
        self,
        leases: Sequence[tuple[UUID, UUID]],
        *,
        lease_seconds: float,
        worker: WorkerIdentity | None = None,
    ) -> dict[UUID, LeaseState]:
        """Renews every (run_id, lease_token) in one statement, which also
        marks the worker seen. Returns the runs whose lease is still held:
        renewed (with their status and whether a steer waits) or, when their
        row was busy, not renewed this tick (status None). A run missing
        from the answer lost its lease."""
        rows = await self._fetch_all(
            "renew_leases",
            {
                "run_ids": [run_id for run_id, _ in leases],
                "lease_tokens": [token for _, token in leases],
                "lease_seconds": float(lease_seconds),
                "worker_id": worker.id if worker else "",
                "hostname": worker.hostname if worker else "",
                "pid": worker.pid if worker else 0,
                "agents": worker.agents if worker else None,
                "concurrency": worker.concurrency if worker else 0,
            },
        )
        return {
            row["id"]: LeaseState(RunStatus(row["status"]), bool(row["steer_requested"]))
            if row["renewed"]
            else LeaseState(None, False, still_held=row["still_held"])
            for row in rows
            if row["renewed"] or row["still_held"]
        }

    async def queue_gauges(self, *, tenant: str | None = None) -> list[DictRow]:
        return await self._fetch_all("queue_gauges", {"tenant": tenant})

    async def dead_count(self, *, tenant: str | None = None) -> int:
        row = await self._fetch_one("dead_count", {"tenant": tenant})
        return int(row["count"]) if row else 0

    async def waiting_lanes(self, *, tenant: str | None = None, limit: int = 100) -> list[DictRow]:
        return await self._fetch_all("waiting_lanes", {"tenant": tenant, "limit": limit})

    async def worker_stopped(self, worker_id: str) -> None:
        await self._fetch_all("worker_stopped", {"worker_id": worker_id})

    async def list_workers(self, *, alive_seconds: float) -> list[DictRow]:
        """Workers alive, and those that stopped or went silent within the
        last WORKER_FORGET_SECONDS (the pruner deletes older ones)."""
        return await self._fetch_all(
            "list_workers",
            {"alive_seconds": float(alive_seconds), "forget_seconds": WORKER_FORGET_SECONDS},
        )

    async def prune(
        self,
        older_than_seconds: dict[RunStatus, float],
        *,
        batch: int = 500,
        exclusive: bool = False,
    ) -> tuple[int, int] | None:
        """Deletes finished runs (with attempts, events, effects) older than
        the retention of their status, then ended requests, in small
        batches. Returns (runs, requests) deleted. With ``exclusive``, only
        one process prunes at a time: None when another holds the lock."""
        statuses = [str(status) for status in older_than_seconds]
        seconds = [float(value) for value in older_than_seconds.values()]
        async with self.pool.connection() as conn:
            if exclusive:
                async with maintenance_lock(conn, PRUNER_LOCK_KEY) as locked:
                    if not locked:
                        return None
                    return await self._prune(conn, statuses, seconds, batch)
            return await self._prune(conn, statuses, seconds, batch)

    async def _prune(
        self,
        conn: AsyncConnection[DictRow],
        statuses: list[str],
        seconds: list[float],
        batch: int,
    ) -> tuple[int, int]:
        runs = await self._delete_batches(
            conn,
            "prune_runs",
            {"statuses": statuses, "older_than_seconds": seconds, "batch": batch},
        )
        requests = 0
        if seconds:
            requests = await self._delete_batches(
                conn,
                "prune_requests",
                {"older_than_seconds": min(seconds), "batch": batch},
            )
        await self._delete_batches(
            conn, "prune_workers", {"forget_seconds": WORKER_FORGET_SECONDS, "batch": batch}
        )
        return runs, requests

    async def _delete_batches(
        self, conn: AsyncConnection[DictRow], name: str, params: dict[str, Any]
    ) -> int:
        deleted = 0
        while True:
            cur = await conn.execute(self._sql[name], params)
            rows = await cur.fetchall()
            deleted += len(rows)
            if len(rows) < params["batch"]:
                return deleted

    def _finish_params(self, finishes: Sequence[Finish]) -> dict[str, Any]:
        return {
            "run_ids": [f.run_id for f in finishes],
            "lease_tokens": [f.lease_token for f in finishes],
            "outcomes": [str(f.outcome) for f in finishes],
            "outputs": _null_if_all_null(
                [_json(f.output) if f.outcome is Outcome.COMPLETED else None for f in finishes]
            ),
            "errors": _null_if_all_null([_json(f.error) for f in finishes]),
            "retry_delays": _null_if_all_null([_float(f.retry_delay_seconds) for f in finishes]),
            "interrupts": _null_if_all_null([_json(f.interrupt) for f in finishes]),
            "interrupt_expires": _null_if_all_null(
                [_float(f.interrupt_expires_in) for f in finishes]
            ),
            "notify": self.notify,
        }

    async def finish_attempts_status(self, finishes: Sequence[Finish]) -> dict[UUID, RunStatus]:
        """Fenced end of a batch of attempts: each ended run's new status
        (the runs whose token still held the lease; the others changed
        nothing). The worker's; it decodes no row.

        Direct runs end in one autocommit statement. When the batch holds
        lanes' runs (``Finish.lane_id``), one transaction first locks all
        their lanes in id order, then ends the batch, so the relay trigger
        of each lane runs under a lock already held: lane before run, and
        lanes in a fixed order, as every lane writer does (no deadlock).
        The transaction is sent as one pipeline (one round trip)."""
        statuses, _ = await self.finish_attempts_and_claim(finishes, None)
        return statuses

    async def finish_attempts_and_claim(
        self, finishes: Sequence[Finish], claim: ClaimSpec | None
    ) -> tuple[dict[UUID, RunStatus], list[ClaimedRun]]:
        """finish_attempts_status, and with ``claim`` a claim in the same
        transaction, after the outcomes: it sees the runs that the batch's
        lane relays just dispatched, so a lane's next run starts without
        waiting for another round trip and commit. The claim is the usual
        one (best runs first, SKIP LOCKED, caps); it takes no lane lock."""
        if not finishes:
            return {}, []
        params = self._finish_params(finishes)
        lane_ids = sorted({f.lane_id for f in finishes if f.lane_id is not None})
        claimed: list[ClaimedRun] = []
        if claim is not None and claim.agents is not None and not claim.agents:
            claim = None  # serving no agent: nothing to claim
        async with self.pool.connection() as conn:
            finish = self._sql["finish_attempts"]
            # Rows of (id, status) as tuples: one per run ended, no dict each.
            cur = conn.cursor(row_factory=tuple_row)
            if not lane_ids and claim is None:
                await cur.execute(finish, params)
                rows = await cur.fetchall()
            else:
                # No BEGIN and COMMIT: on an autocommit connection the
                # statements a pipeline sends before a Sync are one
                # implicit transaction, committed at the Sync and rolled
                # back whole if one fails (the protocol's pipelining rules).
                # The pipeline's closing Sync sends them and reads every
                # answer: one round trip. psycopg's transaction() in a
                # pipeline waits for its BEGIN, for the statements before
                # its COMMIT and for the COMMIT, and a fetch inside the
                # block waits too: four round trips, as this was until the
                # forty-first session (BENCHMARKS.md section 3).
                claim_cur = None
                async with conn.pipeline():
                    if lane_ids:
                        await conn.execute(self._sql["lock_lanes"], {"lane_ids": lane_ids})
                    await cur.execute(finish, params)
                    if claim is not None:
                        claim_cur = await self._send_claim(conn, claim)
                rows = await cur.fetchall()
                if claim_cur is not None:
                    claimed = await claim_cur.fetchall()
        statuses = {run_id: RunStatus(status) for run_id, status in rows}
        return statuses, claimed

    async def finish_attempts(
        self, finishes: Sequence[Finish], *, lane_id: int | None = None
    ) -> dict[UUID, Run]:
        """finish_attempts_status, answering the ended runs as they are right
        after (read back in a second statement; for callers that show them).
        ``lane_id`` marks every finish as a run of that lane."""
        if lane_id is not None:
            finishes = [replace(f, lane_id=lane_id) for f in finishes]
        statuses = await self.finish_attempts_status(finishes)
        if not statuses:
            return {}
        rows = await self._fetch_all("get_runs", {"run_ids": list(statuses)})
        return {row["id"]: Run.from_row(row) for row in rows}

    async def finish_attempt(
        self,
        run_id: UUID,
        lease_token: UUID,
        outcome: Outcome,
        *,
        output: Any = None,
        error: dict[str, Any] | None = None,
        retry_delay_seconds: float | None = None,
        interrupt: Any = None,
        interrupt_expires_in: float | None = None,
        lane_id: int | None = None,
    ) -> Run | None:
        """Fenced end of one attempt; None when the token no longer holds
        the lease."""
        finished = await self.finish_attempts(
            [
                Finish(
                    run_id,
                    lease_token,
                    outcome,
                    output=output,
                    error=error,
                    retry_delay_seconds=retry_delay_seconds,
                    interrupt=interrupt,
                    interrupt_expires_in=interrupt_expires_in,
                )
            ],
            lane_id=lane_id,
        )
        return finished.get(run_id)

    async def append_event(
        self, run_id: UUID, lease_token: UUID, kind: str, data: Any
    ) -> int | None:
        """Fenced event append; returns the event's seq, None if the lease is lost."""
        row = await self._fetch_one(
            "append_event",
            {"run_id": run_id, "lease_token": lease_token, "kind": kind, "data": Jsonb(data)},
        )
        assert row is not None  # a function call: always one row
        return None if row["seq"] is None else int(row["seq"])

    async def append_events(self, events: Sequence[EventAppend]) -> list[int | None]:
        """Fenced appends of many runs' events in one statement (a worker
        batches its runs' events): each event's seq, in the order given,
        or None where its lease was not held. A run's events get
        consecutive seqs in the order given."""
        if not events:
            return []
        if len(events) == 1:
            # A run streaming alone: the one-event statement is the cheaper.
            (event,) = events
            return [
                await self.append_event(event.run_id, event.lease_token, event.kind, event.data)
            ]
        params = {
            "run_ids": [e.run_id for e in events],
            "lease_tokens": [e.lease_token for e in events],
            "kinds": [e.kind for e in events],
            "datas": [Jsonb(e.data) for e in events],
        }
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=tuple_row)
            await cur.execute(self._sql["append_events"], params)
            rows = await cur.fetchall()
        return [None if seq is None else int(seq) for (seq,) in rows]

    async def save_checkpoint(self, run_id: UUID, lease_token: UUID, checkpoint: Any) -> bool:
        row = await self._fetch_one(
            "save_checkpoint",
            {"run_id": run_id, "lease_token": lease_token, "checkpoint": Jsonb(checkpoint)},
        )
        assert row is not None
        return bool(row["saved"])

    async def count_turn(self, run_id: UUID, lease_token: UUID) -> int | None:
        """Fenced: counts one more model turn; None when the lease is lost."""
        row = await self._fetch_one("count_turn", {"run_id": run_id, "lease_token": lease_token})
        assert row is not None
        return None if row["turns"] is None else int(row["turns"])

    async def get_effect(self, run_id: UUID, key: str) -> tuple[bool, Any]:
        """(found, recorded result) of an effect."""
        row = await self._fetch_one("get_effect", {"run_id": run_id, "key": key})
        return (True, row["result"]) if row else (False, None)

    async def record_effect(
        self, run_id: UUID, lease_token: UUID, key: str, result: Any
    ) -> tuple[bool, Any]:
        """Fenced record of an effect's result. Returns (lease held, the
        recorded result — an earlier record of the same key wins)."""
        row = await self._fetch_one(
            "record_effect",
            {"run_id": run_id, "lease_token": lease_token, "key": key, "result": Jsonb(result)},
        )
        assert row is not None
        return bool(row["owned"]), row["result"]

    # -- maintenance ------------------------------------------------------

    async def reap_expired_leases(self, *, limit: int = 500) -> list[tuple[UUID, RunStatus]] | None:
        """Returns the runs whose expired lease was reaped, or None when
        another process holds the reaper lock. Reaped runs wait out a
        backoff, so no wake-up is sent: polling finds them."""
        async with (
            self.pool.connection() as conn,
            maintenance_lock(conn, REAPER_LOCK_KEY) as locked,
        ):
            if not locked:
                return None
            cur = await conn.execute(
                self._sql["reap_expired_leases"], {"limit": limit, "run_id": None}
            )
            reaped = [(row["id"], RunStatus(row["status"])) for row in await cur.fetchall()]
            # Lanes' runs one by one, each in its own transaction under
            # its lane's lock, so the relay happens in that transaction.
            cur = await conn.execute(self._sql["expired_lane_leases"], {"limit": limit})
            for lane_run in await cur.fetchall():
                async with conn.transaction():
                    await conn.execute(self._sql["lock_lane"], {"lane_id": lane_run["lane_id"]})
                    cur = await conn.execute(
                        self._sql["reap_expired_leases"],
                        {"limit": 1, "run_id": lane_run["id"]},
                    )
                    reaped.extend(
                        (row["id"], RunStatus(row["status"])) for row in await cur.fetchall()
                    )
            return reaped


# The columns a claim answers, in order.
_CLAIMED_RUN_COLUMNS = [field.name for field in fields(ClaimedRun)]


def _claimed_run_row(cursor: Any) -> RowMaker[ClaimedRun]:
    """A row factory that builds each claimed run straight from the claim's
    row tuple, whose columns are ClaimedRun's fields in order (checked once
    per result, not per row). A worker builds one per run it claims, so
    this is on its hot path: through a dict row and a from_row, the claim
    took ~16 us of the ~85 us of worker CPU a no-op run cost at the time.
    (``cursor`` is psycopg's BaseCursor, which psycopg 3.2 keeps in a
    private module.)"""
    description = cursor.description
    if description is None:
        raise TypeError("the claim answered no rows")
    names = [column.name for column in description]
    if names != _CLAIMED_RUN_COLUMNS:
        raise TypeError(f"a claim must answer the columns {_CLAIMED_RUN_COLUMNS}, not {names}")

    def claimed_run(values: Sequence[Any]) -> ClaimedRun:
        return ClaimedRun(*values)

    return claimed_run
