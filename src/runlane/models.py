"""The run queue's records, as read from PostgreSQL."""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any
from uuid import UUID


class RunStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    CANCEL_REQUESTED = "cancel_requested"
    COMPLETED = "completed"
    FAILED = "failed"
    DEAD = "dead"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES

    @property
    def is_leased(self) -> bool:
        return self in (RunStatus.RUNNING, RunStatus.CANCEL_REQUESTED)


TERMINAL_STATUSES = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.FAILED,
        RunStatus.DEAD,
        RunStatus.CANCELLED,
        RunStatus.INTERRUPTED,
    }
)


class Outcome(enum.StrEnum):
    """How an attempt ended (run_attempts.outcome)."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RETRY = "retry"
    RELEASED = "released"
    LEASE_EXPIRED = "lease_expired"
    # Ended early at a safe point because a steer arrived: run completed.
    STEERED = "steered"
    # Waiting for a human: run interrupted.
    INTERRUPTED = "interrupted"


# Not frozen: a frozen dataclass sets each field through
# object.__setattr__, and a run has 38; building one took 5.6 us frozen
# against 0.4 us, a worker builds one per claimed run, and a Run is a
# snapshot anyway (changing one changes nothing stored). Its jsonb fields
# made it unhashable already.
@dataclass(slots=True)
class Run:
    id: UUID
    tenant: str
    user_id: str
    thread_id: str | None
    agent: str
    status: RunStatus
    input: Any
    output: Any
    error: dict[str, Any] | None
    priority: int
    available_at: datetime
    attempts: int
    claim_count: int
    turns: int
    max_attempts: int
    budget: dict[str, Any]
    deadline_at: datetime | None
    idempotency_key: str | None
    metadata: dict[str, Any]
    checkpoint: Any
    lease_token: UUID | None
    lease_expires_at: datetime | None
    worker_id: str | None
    last_event_seq: int
    cancel_requested_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    lane_id: int | None
    request_id: UUID | None
    kind: str
    outcome: str | None
    resumed_from: UUID | None
    resume_value: Any
    interrupt: Any
    interrupt_expires_at: datetime | None
    steer_requested_at: datetime | None
    # The client's request_id of the lane request the run came from (only
    # where the read joined it).
    client_request_id: str | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Run:
        return cls(
            id=row["id"],
            tenant=row["tenant"],
            user_id=row["user_id"],
            thread_id=row["thread_id"],
            agent=row["agent"],
            status=RunStatus(row["status"]),
            input=row["input"],
            output=row["output"],
            error=row["error"],
            priority=row["priority"],
            available_at=row["available_at"],
            attempts=row["attempts"],
            claim_count=row["claim_count"],
            turns=row["turns"],
            max_attempts=row["max_attempts"],
            budget=row["budget"],
            deadline_at=row["deadline_at"],
            idempotency_key=row["idempotency_key"],
            metadata=row["metadata"],
            checkpoint=row["checkpoint"],
            lease_token=row["lease_token"],
            lease_expires_at=row["lease_expires_at"],
            worker_id=row["worker_id"],
            last_event_seq=row["last_event_seq"],
            cancel_requested_at=row["cancel_requested_at"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            lane_id=row["lane_id"],
            request_id=row["request_id"],
            kind=row["kind"],
            outcome=row["outcome"],
            resumed_from=row["resumed_from"],
            resume_value=row["resume_value"],
            interrupt=row["interrupt"],
            interrupt_expires_at=row["interrupt_expires_at"],
            steer_requested_at=row["steer_requested_at"],
            client_request_id=row.get("client_request_id"),
        )


@dataclass(slots=True)
class ClaimedRun:
    """A run this worker just claimed, with its lease: the columns of the
    run that the worker and the handler's context read, and no others.

    A claim answers only these (claim_batch in queries.sql lists them in
    this order): decoding all 38 columns of the run took about a fifth of
    the worker's CPU per no-op run, most of it in times and ids that
    nothing on the worker reads. Not frozen: a frozen dataclass sets each
    field through ``object.__setattr__``, and one of these is made per run.
    """

    id: UUID
    agent: str
    tenant: str
    user_id: str
    thread_id: str | None
    kind: str
    lane_id: int | None
    input: Any
    # This cycle's attempt number (see Run.attempts).
    attempts: int
    max_attempts: int
    turns: int
    checkpoint: Any
    resume_value: Any
    metadata: dict[str, Any]
    budget: dict[str, Any]
    steer_requested_at: datetime | None
    lease_token: UUID
    # Seconds left until the run's budget deadline, by the database clock.
    deadline_in_seconds: float | None
    # Claimed by a submit, through this worker's standing claim.
    pushed: bool = False

    @classmethod
    def from_pushed_claim(cls, values: list[Any], deadline_in_seconds: float | None) -> ClaimedRun:
        """A pushed run, from the claim's columns in this class's order as
        PostgreSQL writes them in a JSON array (what a push carries, a
        submit's and a lane's): ids and times as text, jsonb columns as the
        JSON they hold, as psycopg would have decoded them."""
        if len(values) != len(_CLAIM_COLUMNS):
            raise ValueError(f"a pushed claim of {len(values)} columns")
        (run_id, agent, tenant, user_id, thread_id, kind, lane_id, input, attempts,
         max_attempts, turns, checkpoint, resume_value, metadata, budget, steer,
         lease_token) = values  # fmt: skip
        if lease_token is None:
            raise ValueError("a pushed run without a lease")
        return cls(
            id=UUID(run_id),
            agent=agent,
            tenant=tenant,
            user_id=user_id,
            thread_id=thread_id,
            kind=kind,
            lane_id=lane_id,
            input=input,
            attempts=attempts,
            max_attempts=max_attempts,
            turns=turns,
            checkpoint=checkpoint,
            resume_value=resume_value,
            metadata=metadata,
            budget=budget,
            steer_requested_at=None if steer is None else datetime.fromisoformat(steer),
            lease_token=UUID(lease_token),
            deadline_in_seconds=deadline_in_seconds,
            pushed=True,
        )

    @classmethod
    def from_pushed_json(cls, row: dict[str, Any], deadline_in_seconds: float | None) -> ClaimedRun:
        """A pushed run, from its row as PostgreSQL's ``to_json`` writes it
        (what a push carried before migration 0046, from a database not
        migrated yet): the claim's columns taken from it by name."""
        return cls.from_pushed_claim([row[name] for name in _CLAIM_COLUMNS], deadline_in_seconds)


# The columns of a claim (a claimed row, or a push's array), in order: every
# field of ClaimedRun but the two the worker sets.
_CLAIM_COLUMNS = tuple(
    f.name for f in fields(ClaimedRun) if f.name not in ("deadline_in_seconds", "pushed")
)


@dataclass(frozen=True, slots=True)
class Attempt:
    run_id: UUID
    attempt: int
    worker_id: str
    lease_token: UUID
    started_at: datetime
    ended_at: datetime | None
    outcome: str | None
    error: dict[str, Any] | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Attempt:
        return cls(**{name: row[name] for name in cls.__slots__})


@dataclass(frozen=True, slots=True)
class Event:
    run_id: UUID
    seq: int
    kind: str
    data: Any
    attempt: int | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Event:
        return cls(**{name: row[name] for name in cls.__slots__})


@dataclass(frozen=True, slots=True)
class LeaseState:
    """One held lease as the heartbeat saw it."""

    # None when the row was busy (locked) this tick: neither renewed nor lost.
    status: RunStatus | None
    steer_requested: bool
    still_held: bool = True

    @property
    def renewed(self) -> bool:
        return self.status is not None
