"""The rules of a lane, as pure functions (DESIGN.md §1 layer 2, §2).

A lane is the scope (tenant, user, agent, thread_id). At most one run is
active per lane; requests wait in server order, a steer first. The lane
store applies these decisions inside one transaction holding the lane's
row lock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID


class Policy(enum.StrEnum):
    ENQUEUE = "enqueue"
    REJECT = "reject"
    STEER = "steer"


class RequestStatus(enum.StrEnum):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    CANCELLED = "cancelled"
    REJECTED = "rejected"
    FAILED = "failed"


class LaneState(enum.StrEnum):
    IDLE = "idle"
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    PAUSED = "paused"


class Refusal(enum.StrEnum):
    """Why a lane refused or rejected something. Stable, documented codes."""

    LANE_BUSY = "lane_busy"
    QUEUE_NOT_EMPTY = "queue_not_empty"
    LANE_PAUSED = "lane_paused"
    RUN_INTERRUPTED = "run_interrupted"
    STEER_ALREADY_PENDING = "steer_already_pending"
    STEER_IN_PROGRESS = "steer_in_progress"
    REQUEST_ID_CONFLICT = "request_id_conflict"
    REQUEST_ALREADY_DISPATCHED = "request_already_dispatched"
    REQUEST_NOT_QUEUED = "request_not_queued"
    QUEUE_NOT_PAUSED = "queue_not_paused"
    QUEUE_EMPTY = "queue_empty"
    RUN_ACTIVE = "run_active"
    NOT_INTERRUPTED = "not_interrupted"
    RESUME_SUPERSEDED = "resume_superseded"


@dataclass(frozen=True, slots=True)
class LaneFacts:
    """What the lane looks like, read under its lock."""

    has_active_run: bool
    paused: bool
    interrupted: bool
    queued: int
    queued_steer: bool

    @property
    def state(self) -> LaneState:
        if self.has_active_run:
            return LaneState.RUNNING
        if self.interrupted:
            return LaneState.INTERRUPTED
        if self.paused:
            return LaneState.PAUSED
        return LaneState.IDLE

    @property
    def may_start_run(self) -> bool:
        return self.state is LaneState.IDLE


def continue_refusal(lane: LaneFacts) -> Refusal | None:
    """Why ``continue`` does not apply to the lane, or None when it does."""
    if lane.interrupted:
        return Refusal.RUN_INTERRUPTED
    if lane.has_active_run:
        return Refusal.RUN_ACTIVE
    if not lane.paused:
        return Refusal.QUEUE_NOT_PAUSED
    if not lane.queued:
        return Refusal.QUEUE_EMPTY
    return None


@dataclass(frozen=True, slots=True)
class LaneKey:
    tenant: str
    user_id: str
    agent: str
    thread_id: str


@dataclass(frozen=True, slots=True)
class Request:
    """A request as stored, with its live position while queued."""

    id: UUID
    request_id: str
    tenant: str
    lane_id: int
    user_id: str
    agent: str
    thread_id: str
    policy: Policy
    steer: bool
    status: RequestStatus
    reason: str | None
    input: Any
    priority: int
    metadata: dict[str, Any]
    run_id: UUID | None
    position: int | None
    created_at: datetime
    dispatched_at: datetime | None
    ended_at: datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Request:
        return cls(
            id=row["id"],
            request_id=row["request_id"],
            tenant=row["tenant"],
            lane_id=row["lane_id"],
            user_id=row["user_id"],
            agent=row["agent"],
            thread_id=row["thread_id"],
            policy=Policy(row["policy"]),
            steer=row["steer"],
            status=RequestStatus(row["status"]),
            reason=row["reason"],
            input=row["input"],
            priority=row["priority"],
            metadata=row["metadata"],
            run_id=row["run_id"],
            position=None if row["position"] is None else int(row["position"]),
            created_at=row["created_at"],
            dispatched_at=row["dispatched_at"],
            ended_at=row["ended_at"],
        )


@dataclass(frozen=True, slots=True)
class LaneSnapshot:
    key: LaneKey
    state: LaneState
    paused_reason: str | None
    # The active run; or, when paused, the run that paused the lane; or,
    # when interrupted, the interrupted run.
    run_id: UUID | None
    queued: list[Request]
