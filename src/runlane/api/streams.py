"""Server-sent event streams of runs and requests.

Each stream subscribes to the process's EventHub (one LISTEN connection
for all subscribers) and reads the tables after every wake-up, and at
least every few seconds in any case: the tables are the source of truth.
A run's stream reads through its topic, once per wake-up for all of that
run's subscribers; a request's stream reads the request itself.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

from runlane.event_hub import REREAD_SECONDS, EventHub
from runlane.lane_service import LaneService
from runlane.lanes import RequestStatus
from runlane.service import RunService


def sse(data: Any, *, event: str | None = None, event_id: int | None = None) -> str:
    lines = []
    if event_id is not None:
        lines.append(f"id: {event_id}")
    if event is not None:
        lines.append(f"event: {event}")
    lines.append(f"data: {json.dumps(data, default=str)}")
    return "\n".join(lines) + "\n\n"


async def run_events(
    hub: EventHub,
    runs: RunService,
    run_id: UUID,
    *,
    after_seq: int,
    keepalive_seconds: float,
) -> AsyncIterator[str]:
    """Replays the run's events after ``after_seq``, streams new ones, and
    ends with an ``end`` event carrying the run's final status.

    The reads are the run topic's (``EventHub``): one per notification for
    all of the run's subscribers, each a snapshot of the run and its events.
    ``runs`` is the service the route already read the run with."""
    del runs  # the topic reads the tables itself
    subscription = hub.subscribe_run(run_id)
    try:
        seq = after_seq
        idle = 0.0
        periodic = False
        while True:
            batch = await subscription.feed.read(seq, periodic=periodic)
            for event in batch.events:
                seq = event.seq
                yield sse(
                    {
                        "seq": event.seq,
                        "kind": event.kind,
                        "data": event.data,
                        "attempt": event.attempt,
                    },
                    event=event.kind,
                    event_id=event.seq,
                )
            if batch.end is not None:
                end = batch.end
                yield sse(
                    {
                        "run_id": str(end.run_id),
                        "status": end.status,
                        "outcome": end.outcome,
                        "output": end.output,
                        "error": end.error,
                        "interrupt": end.interrupt,
                    },
                    event="end",
                )
                return
            if batch.gone:
                return
            if batch.more:
                periodic = False
                continue
            wait = min(REREAD_SECONDS, keepalive_seconds)
            woke = await subscription.wait(wait)
            periodic = not woke
            idle = 0.0 if woke else idle + wait
            if idle >= keepalive_seconds:
                idle = 0.0
                yield ": keep-alive\n\n"
    finally:
        subscription.close()


async def request_events(
    hub: EventHub,
    lanes: LaneService,
    *,
    tenant: str,
    request_id: str,
    keepalive_seconds: float,
) -> AsyncIterator[str]:
    """``queued`` with the position whenever it changes, then ``dispatched``
    with the run id, or the request's terminal state; then the stream ends."""
    request = await lanes.get_request(tenant=tenant, request_id=request_id)
    subscription = hub.subscribe(f"lane:{request.lane_id}")
    try:
        last_position: int | None = None
        idle = 0.0
        while True:
            request = await lanes.get_request(tenant=tenant, request_id=request_id)
            if request.status is RequestStatus.QUEUED:
                if request.position != last_position:
                    last_position = request.position
                    yield sse(
                        {"request_id": request.request_id, "position": request.position},
                        event="queued",
                    )
            else:
                body: dict[str, Any] = {
                    "request_id": request.request_id,
                    "status": request.status,
                }
                if request.status is RequestStatus.DISPATCHED:
                    body["run_id"] = str(request.run_id)
                if request.reason:
                    body["reason"] = request.reason
                yield sse(body, event=str(request.status))
                return
            woke = await subscription.wait(min(REREAD_SECONDS, keepalive_seconds))
            idle = 0.0 if woke else idle + min(REREAD_SECONDS, keepalive_seconds)
            if idle >= keepalive_seconds:
                idle = 0.0
                yield ": keep-alive\n\n"
    finally:
        subscription.close()
