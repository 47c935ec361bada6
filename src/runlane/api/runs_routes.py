"""/v1/runs: direct runs, reading, cancel, resume, retry, event streams."""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from runlane.api.auth import Admin, Caller
from runlane.api.context import ApiContext, owner_filter
from runlane.api.errors import ApiError
from runlane.api.schemas import (
    NAME_PATTERN,
    THREAD_PATTERN,
    ErrorResponse,
    ResumeBody,
    RunOut,
    RunPage,
    RunSubmission,
)
from runlane.api.streams import run_events
from runlane.models import RunStatus
from runlane.store import RunCursor

router = APIRouter(prefix="/v1/runs", tags=["runs"])

ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorResponse, "description": "Missing or unknown API key."},
    404: {"model": ErrorResponse, "description": "No such run in your tenant."},
    422: {"model": ErrorResponse, "description": "Invalid input."},
}


def ctx(request: Request) -> ApiContext:
    context: ApiContext = request.app.state.runlane
    return context


def check_agent(context: ApiContext, agent: str) -> None:
    if context.agents is not None and agent not in context.agents:
        raise ApiError("unknown_agent", f"no agent named {agent!r} is served here")


@router.post(
    "",
    status_code=201,
    response_model=RunOut,
    summary="Submit a direct run (no thread)",
    responses={
        200: {"model": RunOut, "description": "Same idempotency key: the existing run."},
        413: {"model": ErrorResponse},
        **ERRORS,
    },
)
async def submit_run(
    body: RunSubmission, who: Caller, request: Request, response: Response
) -> RunOut:
    context = ctx(request)
    check_agent(context, body.agent)
    run, created = await context.runs.submit(
        body.agent,
        body.input,
        tenant=who.tenant,
        user_id=who.user_id,
        priority=body.priority,
        delay_seconds=body.delay_seconds,
        max_attempts=body.max_attempts,
        budget=body.budget.model_dump(exclude_none=True) if body.budget else None,
        idempotency_key=body.idempotency_key,
        metadata=body.metadata,
    )
    if not created:
        response.status_code = 200
    return RunOut.of(run, admin=who.admin)


def encode_cursor(created_at: datetime, run_id: UUID) -> str:
    raw = f"{created_at.isoformat()}|{run_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> RunCursor:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created, _, run_id = base64.urlsafe_b64decode(padded).decode().partition("|")
        return RunCursor(datetime.fromisoformat(created), UUID(run_id))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ApiError("validation_error", "cursor is not one this API gave out") from None


@router.get("", response_model=RunPage, summary="List runs, newest first", responses=ERRORS)
async def list_runs(
    who: Caller,
    request: Request,
    status: Annotated[list[RunStatus] | None, Query()] = None,
    agent: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=128)] = None,
    thread_id: Annotated[str | None, Query(pattern=THREAD_PATTERN, max_length=200)] = None,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> RunPage:
    context = ctx(request)
    runs = await context.runs.list_runs(
        tenant=who.tenant,
        user_id=owner_filter(who),
        thread_id=thread_id,
        statuses=status,
        agent=agent,
        after=decode_cursor(cursor) if cursor else None,
        limit=limit,
    )
    next_cursor = encode_cursor(runs[-1].created_at, runs[-1].id) if len(runs) == limit else None
    return RunPage(items=[RunOut.of(r, admin=who.admin) for r in runs], next_cursor=next_cursor)


@router.get("/{run_id}", response_model=RunOut, summary="Read a run", responses=ERRORS)
async def get_run(run_id: str, who: Caller, request: Request) -> RunOut:
    context = ctx(request)
    run = await context.runs.get(run_id, tenant=who.tenant, user_id=owner_filter(who))
    attempts = await context.runs.store.list_attempts(run.id)
    return RunOut.of(run, admin=who.admin, attempts=attempts)


@router.post(
    "/{run_id}/cancel",
    response_model=RunOut,
    summary="Request a durable cancel",
    responses={409: {"model": ErrorResponse, "description": "run_finished"}, **ERRORS},
)
async def cancel_run(run_id: str, who: Caller, request: Request) -> RunOut:
    context = ctx(request)
    run = await context.runs.get(run_id, tenant=who.tenant, user_id=owner_filter(who))
    return RunOut.of(await context.runs.cancel(run.id), admin=who.admin)


@router.post(
    "/{run_id}/resume",
    status_code=201,
    response_model=RunOut,
    summary="Resume an interrupted run with an answer",
    responses={
        200: {"model": RunOut, "description": "Same value again: the same resume run."},
        409: {"model": ErrorResponse, "description": "not_interrupted, resume_superseded"},
        413: {"model": ErrorResponse, "description": "The value is over the input limit."},
        **ERRORS,
    },
)
async def resume_run(
    run_id: str, body: ResumeBody, who: Caller, request: Request, response: Response
) -> RunOut:
    context = ctx(request)
    run = await context.runs.get(run_id, tenant=who.tenant, user_id=owner_filter(who))
    resumed, created = await context.lanes.resume(run.id, body.value)
    if not created:
        response.status_code = 200
    return RunOut.of(resumed, admin=who.admin)


@router.post(
    "/{run_id}/retry",
    response_model=RunOut,
    summary="Re-queue a failed or dead run (admin)",
    responses={
        403: {"model": ErrorResponse, "description": "Not an admin key."},
        409: {"model": ErrorResponse, "description": "not_retryable, lane refusals"},
        **ERRORS,
    },
)
async def retry_run(run_id: str, who: Admin, request: Request) -> RunOut:
    context = ctx(request)
    run = await context.runs.get(run_id, tenant=who.tenant)
    return RunOut.of(await context.runs.requeue(run.id), admin=True)


@router.get(
    "/{run_id}/events",
    summary="Stream a run's events (SSE)",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **ERRORS},
)
async def stream_run_events(
    run_id: str,
    who: Caller,
    request: Request,
    after_seq: Annotated[int | None, Query(ge=0)] = None,
    last_event_id: Annotated[str | None, Header(max_length=40)] = None,
) -> StreamingResponse:
    """Replays the events after ``Last-Event-ID`` (or ``?after_seq=``), then
    streams new ones live; a final ``end`` event carries the run's status.
    Disconnecting never cancels the run."""
    context = ctx(request)
    run = await context.runs.get(run_id, tenant=who.tenant, user_id=owner_filter(who))
    start = after_seq or 0
    if last_event_id:
        try:
            start = max(start, int(last_event_id))
        except ValueError:
            raise ApiError("validation_error", "Last-Event-ID must be an event seq") from None
    return StreamingResponse(
        run_events(
            context.hub,
            context.runs,
            run.id,
            after_seq=start,
            keepalive_seconds=context.keepalive_seconds,
        ),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
