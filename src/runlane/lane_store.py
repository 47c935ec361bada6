"""Data access for lanes and requests: the only module that runs
``sql/lanes.sql``.

Each public method is one transaction that takes the lane's row lock first
(DESIGN.md: intake, dispatch, cancel, steer, continue and resume each read
and change a lane under that lock). The relay after a lane's run ends lives
in the database (trigger ``runs_relay_lane``), in the transaction of that
terminal write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection, Error, errors
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from runlane.database import jsonb_param
from runlane.errors import LaneRefused, NotFound
from runlane.lanes import (
    LaneFacts,
    LaneKey,
    LaneSnapshot,
    LaneState,
    Policy,
    Refusal,
    Request,
    RequestStatus,
    continue_refusal,
)
from runlane.maintenance_lock import maintenance_lock
from runlane.models import Run, RunStatus
from runlane.queries import named_queries

Conn = AsyncConnection[DictRow]


# The SQLSTATE of a refusal raised by runlane.submit_request; its message
# is the refusal code.
REFUSED_SQLSTATE = "RL409"

# The advisory lock of the lane recovery pass ("rl_recov").
RECOVERY_LOCK_KEY = 0x726C5F7265636F76


@dataclass(frozen=True, slots=True)
class RecoveryResult:
    dispatched: int
    interrupts_expired: int


@dataclass(frozen=True, slots=True)
class NewRequest:
    lane: LaneKey
    request_id: str
    policy: Policy
    input: Any
    max_attempts: int
    priority: int = 0
    budget: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    # As NewRun's: the JSON in UTF-8 when already made.
    input_json: bytes | None = None
    metadata_json: bytes | None = None


class LaneStore:
    def __init__(self, pool: AsyncConnectionPool[Conn]) -> None:
        self.pool = pool
        self._sql = named_queries("lanes.sql")

    async def _one(self, conn: Conn, name: str, params: dict[str, Any]) -> DictRow | None:
        cur = await conn.execute(self._sql[name], params)
        return await cur.fetchone()

    async def _all(self, conn: Conn, name: str, params: dict[str, Any]) -> list[DictRow]:
        cur = await conn.execute(self._sql[name], params)
        return await cur.fetchall()

    async def _facts(self, conn: Conn, lane: DictRow) -> tuple[LaneFacts, DictRow]:
        row = await self._one(conn, "lane_facts", {"lane_id": lane["id"]})
        assert row is not None
        facts = LaneFacts(
            has_active_run=row["active_run_id"] is not None,
            paused=lane["paused_run_id"] is not None,
            interrupted=lane["interrupted_run_id"] is not None,
            queued=int(row["queued"]),
            queued_steer=row["queued_steer_id"] is not None,
        )
        return facts, row

    async def _request(self, conn: Conn, request_uuid: UUID) -> Request:
        row = await self._one(conn, "request_with_position", {"id": request_uuid})
        assert row is not None
        return Request.from_row(row)

    async def _ask_active_to_yield(self, conn: Conn, facts_row: DictRow) -> None:
        """A steer waits: the active run yields at its next safe point. A
        tool call in progress is never stopped by a steer."""
        await conn.execute(self._sql["request_steer"], {"run_id": facts_row["active_run_id"]})

    # -- intake ---------------------------------------------------------------

    async def submit(self, new: NewRequest) -> tuple[Request, bool]:
        """Stores the request and dispatches it if the lane lets it start.
        Returns it with whether it is new; raises LaneRefused for a refusal
        that stores nothing. One statement: runlane.submit_request (the
        intake rules are there, migration 0022)."""
        key = new.lane
        params = {
            **_key_params(key),
            "request_id": new.request_id,
            "policy": str(new.policy),
            "input": jsonb_param(new.input, new.input_json),
            "priority": new.priority,
            "max_attempts": new.max_attempts,
            "budget": Jsonb(new.budget or {}),
            "metadata": jsonb_param(new.metadata or {}, new.metadata_json),
        }
        for _ in range(3):
            try:
                async with self.pool.connection() as conn:
                    row = await self._one(conn, "submit_request", params)
            except errors.UniqueViolation as exc:
                # The same request_id committed concurrently (in another
                # lane, whose lock we do not hold): look again.
                if exc.diag.constraint_name != "requests_tenant_request_id_key":
                    raise
                continue
            except Error as exc:
                if exc.sqlstate != REFUSED_SQLSTATE:
                    raise
                reason = Refusal(str(exc.diag.message_primary))
                message = (
                    f"request_id {new.request_id!r} was used for another submission"
                    if reason is Refusal.REQUEST_ID_CONFLICT
                    else _refusal_message(reason)
                )
                raise LaneRefused(reason, message) from None
            assert row is not None
            return Request.from_row(row), bool(row["created"])
        raise RuntimeError("request intake kept colliding on its request_id")

    # -- reads ----------------------------------------------------------------

    async def get_request(self, tenant: str, request_id: str) -> Request:
        async with self.pool.connection() as conn:
            row = await self._one(
                conn, "find_request", {"tenant": tenant, "request_id": request_id}
            )
            if row is None:
                raise NotFound(f"no request {request_id!r}")
            return await self._request(conn, row["id"])

    async def get_request_by_id(self, request_uuid: UUID) -> Request:
        async with self.pool.connection() as conn:
            return await self._request(conn, request_uuid)

    async def snapshot(self, key: LaneKey) -> LaneSnapshot:
        """The lane as a user sees it; an unknown lane is idle and empty."""
        async with self.pool.connection() as conn, conn.transaction():
            lane = await self._one(conn, "find_lane", _key_params(key))
            if lane is None:
                return LaneSnapshot(key, LaneState.IDLE, None, None, [])
            facts, facts_row = await self._facts(conn, lane)
            queued = await self._all(conn, "queued_requests", {"lane_id": lane["id"]})
            run_id = {
                LaneState.RUNNING: facts_row["active_run_id"],
                LaneState.PAUSED: lane["paused_run_id"],
                LaneState.INTERRUPTED: lane["interrupted_run_id"],
                LaneState.IDLE: None,
            }[facts.state]
            return LaneSnapshot(
                key,
                facts.state,
                lane["paused_reason"] if facts.state is LaneState.PAUSED else None,
                run_id,
                [Request.from_row(row) for row in queued],
            )

    # -- changes to queued requests -------------------------------------------

    async def _locked_request(self, conn: Conn, tenant: str, request_id: str) -> DictRow:
        row = await self._one(conn, "find_request", {"tenant": tenant, "request_id": request_id})
        if row is None:
            raise NotFound(f"no request {request_id!r}")
        await conn.execute(self._sql["lock_lane"], {"lane_id": row["lane_id"]})
        # Read again under the lock: the request may have moved meanwhile.
        locked = await self._one(conn, "find_request", {"tenant": tenant, "request_id": request_id})
        assert locked is not None
        return locked

    def _refuse_unless_queued(self, row: DictRow) -> None:
        status = RequestStatus(row["status"])
        if status is RequestStatus.DISPATCHED:
            raise LaneRefused(
                Refusal.REQUEST_ALREADY_DISPATCHED,
                f"request {row['request_id']!r} is already running as run {row['run_id']};"
                " cancel that run instead",
                run_id=row["run_id"],
            )
        if status is not RequestStatus.QUEUED:
            raise LaneRefused(
                Refusal.REQUEST_NOT_QUEUED, f"request {row['request_id']!r} is {status}"
            )

    async def cancel_request(self, tenant: str, request_id: str) -> Request:
        """Cancels a queued request; the requests behind it move up."""
        async with self.pool.connection() as conn, conn.transaction():
            row = await self._locked_request(conn, tenant, request_id)
            if row["status"] == RequestStatus.CANCELLED:
                return await self._request(conn, row["id"])
            self._refuse_unless_queued(row)
            lane = await self._one(conn, "lock_lane", {"lane_id": row["lane_id"]})
            assert lane is not None
            facts, facts_row = await self._facts(conn, lane)
            if row["steer"] and facts_row["active_run_asked_to_yield"]:
                raise LaneRefused(
                    Refusal.STEER_IN_PROGRESS,
                    "the running run was already asked to yield to this steer",
                )
            await conn.execute(self._sql["cancel_request"], {"id": row["id"]})
            if facts.paused and facts.queued == 1:
                # Nothing waits any more: the lane is idle again.
                await conn.execute(self._sql["unpause_lane"], {"lane_id": row["lane_id"]})
            return await self._request(conn, row["id"])

    async def promote_to_steer(self, tenant: str, request_id: str) -> Request:
        """Makes a queued request the lane's steer: it goes first, and the
        running run yields to it at its next safe point."""
        async with self.pool.connection() as conn, conn.transaction():
            row = await self._locked_request(conn, tenant, request_id)
            self._refuse_unless_queued(row)
            if row["steer"]:
                return await self._request(conn, row["id"])
            lane = await self._one(conn, "lock_lane", {"lane_id": row["lane_id"]})
            assert lane is not None
            facts, facts_row = await self._facts(conn, lane)
            if facts.interrupted:
                raise LaneRefused(
                    Refusal.RUN_INTERRUPTED, _refusal_message(Refusal.RUN_INTERRUPTED)
                )
            if facts.queued_steer:
                raise LaneRefused(
                    Refusal.STEER_ALREADY_PENDING, _refusal_message(Refusal.STEER_ALREADY_PENDING)
                )
            await conn.execute(self._sql["promote_request"], {"id": row["id"]})
            if facts.has_active_run:
                await self._ask_active_to_yield(conn, facts_row)
            elif facts.may_start_run:
                await conn.execute(self._sql["dispatch_head"], {"lane_id": row["lane_id"]})
            return await self._request(conn, row["id"])

    # -- lane-wide changes ----------------------------------------------------

    async def continue_lane(self, key: LaneKey) -> Request:
        """Dispatches only the head of a paused lane; returns it."""
        async with self.pool.connection() as conn, conn.transaction():
            found = await self._one(conn, "find_lane", _key_params(key))
            if found is None:
                raise LaneRefused(Refusal.QUEUE_NOT_PAUSED, "the lane is not paused")
            lane = await self._one(conn, "lock_lane", {"lane_id": found["id"]})
            assert lane is not None
            facts, _ = await self._facts(conn, lane)
            refusal = continue_refusal(facts)
            if refusal is not None:
                raise LaneRefused(refusal, _refusal_message(refusal))
            await conn.execute(self._sql["unpause_lane"], {"lane_id": lane["id"]})
            dispatched = await self._one(conn, "dispatch_head", {"lane_id": lane["id"]})
            assert dispatched is not None and dispatched["run_id"] is not None
            head = await self._one(conn, "request_of_run", {"run_id": dispatched["run_id"]})
            assert head is not None
            return await self._request(conn, head["id"])

    async def resume(self, run: Run, value: Any) -> tuple[Run, bool]:
        """Starts the resume of an interrupted run (once). Returns the resume
        run and whether this call created it."""
        async with self.pool.connection() as conn, conn.transaction():
            if run.lane_id is not None:
                lane = await self._one(conn, "lock_lane", {"lane_id": run.lane_id})
                assert lane is not None
            else:
                lane = None
            existing = await self._one(conn, "find_resume", {"run_id": run.id})
            if existing is not None:
                if existing["resume_value"] == value:
                    return Run.from_row(existing), False
                raise LaneRefused(Refusal.RESUME_SUPERSEDED, f"run {run.id} was already resumed")
            current = await self._one(conn, "lock_run", {"run_id": run.id})
            if current is None or current["status"] != RunStatus.INTERRUPTED:
                raise LaneRefused(Refusal.NOT_INTERRUPTED, f"run {run.id} is not interrupted")
            if lane is not None and lane["interrupted_run_id"] != run.id:
                raise LaneRefused(
                    Refusal.RESUME_SUPERSEDED,
                    f"run {run.id} is not the lane's latest interrupted run",
                )
            created = await self._one(
                conn, "insert_resume_run", {"run_id": run.id, "value": Jsonb(value)}
            )
            assert created is not None
            return Run.from_row(created), True

    # -- recovery -------------------------------------------------------------

    async def recover(self, *, limit: int = 500) -> RecoveryResult | None:
        """One maintenance pass, under an advisory lock (None when another
        process holds it): dispatches the head of every idle lane that has
        queued requests (only a crash or an operator's edit leaves one), and
        ends unanswered interrupts past their expiry, cancelled. Each lane
        is handled in its own short transaction."""
        async with (
            self.pool.connection() as conn,
            maintenance_lock(conn, RECOVERY_LOCK_KEY) as locked,
        ):
            return await self._recover(conn, limit) if locked else None

    async def _recover(self, conn: Conn, limit: int) -> RecoveryResult:
        dispatched = expired = 0
        for row in await self._all(conn, "lanes_needing_dispatch", {"limit": limit}):
            async with conn.transaction():
                lane = await self._one(conn, "lock_lane", {"lane_id": row["lane_id"]})
                assert lane is not None
                facts, _ = await self._facts(conn, lane)
                if facts.may_start_run and facts.queued:
                    await conn.execute(self._sql["dispatch_head"], {"lane_id": lane["id"]})
                    dispatched += 1
        for row in await self._all(conn, "expired_interrupts", {"limit": limit}):
            async with conn.transaction():
                if row["lane_id"] is not None:
                    await conn.execute(self._sql["lock_lane"], {"lane_id": row["lane_id"]})
                if await self._one(conn, "expire_interrupt", {"run_id": row["id"]}):
                    expired += 1
        return RecoveryResult(dispatched=dispatched, interrupts_expired=expired)


def _key_params(key: LaneKey) -> dict[str, str]:
    return {
        "tenant": key.tenant,
        "user_id": key.user_id,
        "agent": key.agent,
        "thread_id": key.thread_id,
    }


_MESSAGES = {
    Refusal.RUN_INTERRUPTED: "the lane's run is interrupted: resume or cancel it first",
    Refusal.STEER_ALREADY_PENDING: "the lane already has a queued steer",
    Refusal.QUEUE_NOT_PAUSED: "the lane is not paused",
    Refusal.QUEUE_EMPTY: "the lane has no queued request",
    Refusal.RUN_ACTIVE: "the lane has an active run",
}


def _refusal_message(reason: Refusal) -> str:
    return _MESSAGES.get(reason, str(reason))
