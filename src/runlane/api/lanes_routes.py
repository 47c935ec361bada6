"""/v1/threads and /v1/requests: per-thread request queues (lanes)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from runlane.api.auth import Caller
from runlane.api.context import ApiContext
from runlane.api.runs_routes import ERRORS, check_agent, ctx
from runlane.api.schemas import (
    NAME_PATTERN,
    REQUEST_ID_PATTERN,
    THREAD_PATTERN,
    ErrorResponse,
    QueueOut,
    RequestOut,
    RequestSubmission,
)
from runlane.api.streams import request_events
from runlane.errors import LaneRefused, NotFound
from runlane.keys import Principal
from runlane.lanes import Request as LaneRequest
from runlane.lanes import RequestStatus

router = APIRouter(tags=["threads and requests"])

ThreadId = Annotated[str, Path(pattern=THREAD_PATTERN, max_length=200)]
RequestId = Annotated[str, Path(pattern=REQUEST_ID_PATTERN, max_length=200)]
AgentQuery = Annotated[str, Query(pattern=NAME_PATTERN, max_length=128)]

REFUSALS: dict[int | str, dict[str, object]] = {
    409: {
        "model": ErrorResponse,
        "description": "A lane refusal: run_interrupted, steer_already_pending,"
        " request_id_conflict, request_already_dispatched, steer_in_progress,"
        " queue_not_paused, queue_empty, run_active, request_not_queued.",
    },
    **ERRORS,
}


def count_refusal(context: ApiContext, code: str) -> None:
    context.metrics.lane_refusals.labels(code=code).inc()


async def visible_request(context: ApiContext, who: Principal, request_id: str) -> LaneRequest:
    """The request if the key may see it: its tenant, and its user unless admin."""
    found = await context.lanes.get_request(tenant=who.tenant, request_id=request_id)
    if not who.admin and found.user_id != who.user_id:
        raise NotFound(f"no request {request_id!r}")
    return found


@router.post(
    "/v1/threads/{thread_id}/requests",
    status_code=201,
    response_model=RequestOut,
    summary="Submit a message into a thread's lane",
    responses={
        200: {"model": RequestOut, "description": "Same request_id and input: the existing one."},
        413: {"model": ErrorResponse},
        **REFUSALS,
    },
)
async def submit_request(
    thread_id: ThreadId,
    body: RequestSubmission,
    who: Caller,
    request: Request,
    response: Response,
) -> RequestOut:
    """Dispatched at once on an idle lane; otherwise queued (enqueue, steer)
    or stored as rejected with a reason (reject). A rejection is a normal
    result (201), not an error."""
    context = ctx(request)
    check_agent(context, body.agent)
    try:
        submitted, created = await context.lanes.submit(
            tenant=who.tenant,
            user_id=who.user_id,
            agent=body.agent,
            thread_id=thread_id,
            input=body.input,
            policy=body.policy,
            request_id=body.request_id,
            priority=body.priority,
            metadata=body.metadata,
        )
    except LaneRefused as exc:
        count_refusal(context, exc.code)
        raise
    if submitted.status is RequestStatus.REJECTED and submitted.reason and created:
        count_refusal(context, submitted.reason)
    if not created:
        response.status_code = 200
    return RequestOut.of(submitted)


@router.get(
    "/v1/threads/{thread_id}/queue",
    response_model=QueueOut,
    summary="A thread's lane: state, active run, queued requests",
    responses=ERRORS,
)
async def get_queue(
    thread_id: ThreadId, agent: AgentQuery, who: Caller, request: Request
) -> QueueOut:
    context = ctx(request)
    snapshot = await context.lanes.snapshot(
        tenant=who.tenant, user_id=who.user_id, agent=agent, thread_id=thread_id
    )
    return QueueOut.of(snapshot)


@router.post(
    "/v1/threads/{thread_id}/queue/continue",
    response_model=RequestOut,
    summary="Dispatch the head of a paused lane",
    responses=REFUSALS,
)
async def continue_queue(
    thread_id: ThreadId, agent: AgentQuery, who: Caller, request: Request
) -> RequestOut:
    context = ctx(request)
    try:
        head = await context.lanes.continue_lane(
            tenant=who.tenant, user_id=who.user_id, agent=agent, thread_id=thread_id
        )
    except LaneRefused as exc:
        count_refusal(context, exc.code)
        raise
    return RequestOut.of(head)


@router.get(
    "/v1/requests/{request_id}",
    response_model=RequestOut,
    summary="A request, with its live position",
    responses=ERRORS,
)
async def get_request(request_id: RequestId, who: Caller, request: Request) -> RequestOut:
    return RequestOut.of(await visible_request(ctx(request), who, request_id))


@router.post(
    "/v1/requests/{request_id}/cancel",
    response_model=RequestOut,
    summary="Cancel a queued request",
    responses=REFUSALS,
)
async def cancel_request(request_id: RequestId, who: Caller, request: Request) -> RequestOut:
    context = ctx(request)
    await visible_request(context, who, request_id)
    try:
        cancelled = await context.lanes.cancel_request(tenant=who.tenant, request_id=request_id)
    except LaneRefused as exc:
        count_refusal(context, exc.code)
        raise
    return RequestOut.of(cancelled)


@router.post(
    "/v1/requests/{request_id}/steer",
    response_model=RequestOut,
    summary="Promote a queued request to steer",
    responses=REFUSALS,
)
async def steer_request(request_id: RequestId, who: Caller, request: Request) -> RequestOut:
    context = ctx(request)
    await visible_request(context, who, request_id)
    try:
        promoted = await context.lanes.promote_to_steer(tenant=who.tenant, request_id=request_id)
    except LaneRefused as exc:
        count_refusal(context, exc.code)
        raise
    return RequestOut.of(promoted)


@router.get(
    "/v1/requests/{request_id}/events",
    summary="Stream a request's progress (SSE)",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}, **ERRORS},
)
async def stream_request_events(
    request_id: RequestId, who: Caller, request: Request
) -> StreamingResponse:
    """``queued`` with the position whenever it changes, then ``dispatched``
    with the run id (follow /v1/runs/{run_id}/events next), or the request's
    terminal state (``cancelled``, ``rejected``, ``failed``)."""
    context = ctx(request)
    await visible_request(context, who, request_id)
    return StreamingResponse(
        request_events(
            context.hub,
            context.lanes,
            tenant=who.tenant,
            request_id=request_id,
            keepalive_seconds=context.keepalive_seconds,
        ),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
