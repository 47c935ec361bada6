"""Request and response bodies of the HTTP API (v1)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from runlane.lanes import LaneSnapshot, LaneState, Policy, Request, RequestStatus
from runlane.models import Attempt, Run, RunStatus


def _json_number(value: Any) -> Any:
    """JSON numbers only: no booleans, no numeric strings."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a JSON number")
    return value


def _whole_number(value: Any) -> Any:
    """A whole JSON number (3 or 3.0), as JSON Schema's integer."""
    value = _json_number(value)
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("must be a whole number")
        return int(value)
    return value


Number = Annotated[float, BeforeValidator(_json_number)]
WholeNumber = Annotated[int, BeforeValidator(_whole_number)]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
THREAD_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,199}$"
REQUEST_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,199}$"


class ErrorBody(BaseModel):
    code: str = Field(examples=["steer_already_pending"])
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_seconds: Number | None = Field(default=None, gt=0, le=7 * 24 * 3600)
    max_turns: WholeNumber | None = Field(default=None, ge=1, le=100_000)


class RequestSubmission(BaseModel):
    """A message for the thread's lane."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"agent": "support-bot", "input": {"message": "Where is my order?"}},
                {
                    "agent": "support-bot",
                    "input": {"message": "Actually, cancel it"},
                    "policy": "steer",
                    "request_id": "msg-42",
                },
            ]
        },
    )

    agent: str = Field(pattern=NAME_PATTERN, max_length=128)
    input: Any = Field(default_factory=dict, description="Any JSON value.")
    policy: Policy = Policy.ENQUEUE
    request_id: str | None = Field(
        default=None,
        pattern=REQUEST_ID_PATTERN,
        max_length=200,
        description="Idempotency key, unique per tenant; generated when absent.",
    )
    priority: WholeNumber = Field(default=0, ge=-1000, le=1000)
    metadata: dict[str, Any] | None = None


class RequestOut(BaseModel):
    request_id: str
    thread_id: str
    agent: str
    status: RequestStatus
    policy: Policy
    steer: bool
    position: int | None = Field(description="1 = next, while queued.")
    run_id: UUID | None
    reason: str | None = Field(description="Why it was rejected.")
    input: Any
    created_at: datetime
    dispatched_at: datetime | None
    ended_at: datetime | None

    @classmethod
    def of(cls, request: Request) -> RequestOut:
        return cls(
            request_id=request.request_id,
            thread_id=request.thread_id,
            agent=request.agent,
            status=request.status,
            policy=request.policy,
            steer=request.steer,
            position=request.position,
            run_id=request.run_id,
            reason=request.reason,
            input=request.input,
            created_at=request.created_at,
            dispatched_at=request.dispatched_at,
            ended_at=request.ended_at,
        )


class QueueOut(BaseModel):
    thread_id: str
    agent: str
    state: LaneState
    paused_reason: str | None
    run_id: UUID | None = Field(
        description="The active run; when paused, the run that paused the lane;"
        " when interrupted, the interrupted run."
    )
    queued: list[RequestOut]

    @classmethod
    def of(cls, snapshot: LaneSnapshot) -> QueueOut:
        return cls(
            thread_id=snapshot.key.thread_id,
            agent=snapshot.key.agent,
            state=snapshot.state,
            paused_reason=snapshot.paused_reason,
            run_id=snapshot.run_id,
            queued=[RequestOut.of(r) for r in snapshot.queued],
        )


class RunSubmission(BaseModel):
    """A direct run: no thread, no lane."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"agent": "report-writer", "input": {"topic": "Q3"}, "budget": {"max_seconds": 600}}
            ]
        },
    )

    agent: str = Field(pattern=NAME_PATTERN, max_length=128)
    input: Any = Field(default_factory=dict)
    priority: WholeNumber = Field(default=0, ge=-1000, le=1000)
    delay_seconds: Number = Field(default=0, ge=0, le=365 * 24 * 3600)
    max_attempts: WholeNumber | None = Field(default=None, ge=1, le=100)
    budget: Budget | None = None
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    metadata: dict[str, Any] | None = None


class ResumeBody(BaseModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"value": {"approved": True}}]}
    )

    value: Any = Field(description="The answer the resumed run reads as ctx.resume_value.")


class AttemptOut(BaseModel):
    attempt: int
    worker_id: str | None = Field(description="Shown to admin keys only.")
    started_at: datetime
    ended_at: datetime | None
    outcome: str | None
    error: dict[str, Any] | None

    @classmethod
    def of(cls, attempt: Attempt, *, admin: bool) -> AttemptOut:
        return cls(
            attempt=attempt.attempt,
            worker_id=attempt.worker_id if admin else None,
            started_at=attempt.started_at,
            ended_at=attempt.ended_at,
            outcome=attempt.outcome,
            error=attempt.error,
        )


class RunOut(BaseModel):
    run_id: UUID
    agent: str
    status: RunStatus
    outcome: str | None = Field(description="'steered' when a steer ended it early.")
    kind: str
    thread_id: str | None
    request_id: str | None = Field(
        default=None, description="The request_id of the thread request it runs."
    )
    resumed_from: UUID | None
    resume_value: Any = Field(default=None, description="The answer a resume run carries.")
    input: Any
    output: Any
    error: dict[str, Any] | None
    interrupt: Any = Field(description="The question of an interrupted run.")
    priority: int
    attempts: int
    max_attempts: int
    budget: dict[str, Any]
    metadata: dict[str, Any]
    available_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_event_seq: int
    worker_id: str | None = Field(description="Shown to admin keys only.")
    attempt_history: list[AttemptOut] | None = None

    @classmethod
    def of(cls, run: Run, *, admin: bool, attempts: list[Attempt] | None = None) -> RunOut:
        return cls(
            run_id=run.id,
            agent=run.agent,
            status=run.status,
            outcome=run.outcome,
            kind=run.kind,
            thread_id=run.thread_id,
            resumed_from=run.resumed_from,
            request_id=run.client_request_id,
            resume_value=run.resume_value,
            input=run.input,
            output=run.output,
            error=run.error,
            interrupt=run.interrupt,
            priority=run.priority,
            attempts=run.attempts,
            max_attempts=run.max_attempts,
            budget=run.budget,
            metadata=run.metadata,
            available_at=run.available_at,
            created_at=run.created_at,
            started_at=run.started_at,
            finished_at=run.finished_at,
            last_event_seq=run.last_event_seq,
            worker_id=run.worker_id if admin else None,
            attempt_history=(
                [AttemptOut.of(a, admin=admin) for a in attempts] if attempts is not None else None
            ),
        )


class RunPage(BaseModel):
    items: list[RunOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page.")


class Health(BaseModel):
    status: str
