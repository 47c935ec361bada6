"""Server-sent event streams of runs and requests.

Each stream subscribes to the process's EventHub (one LISTEN connection
for all subscribers) and reads the tables after every wake-up, and at
least every few seconds in any case: the tables are the source of truth.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

from runlane.event_hub import EventHub
from runlane.lane_service import LaneService
from runlane.lanes import RequestStatus
from runlane.service import RunService

# A missed NOTIFY delays delivery by at most this long.
REREAD_SECONDS = 2.0
# Events read per query while replaying.
PAGE = 500


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
    ends with an ``end`` event carrying the run's final status."""
    subscription = hub.subscribe(f"run:{run_id}")
    try:
        seq = after_seq
        idle = 0.0
        while True:
            # The run first: events are written before a terminal status, so
            # once it is seen, the events read next are all there are.
            run = await runs.get(run_id)
            while True:
                page = await runs.store.list_events(run_id, after_seq=seq, limit=PAGE)
                for event in page:
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
                if len(page) < PAGE:
                    break
            if run.status.is_terminal:
                yield sse(
                    {
                        "run_id": str(run.id),
                        "status": run.status,
                        "outcome": run.outcome,
                        "output": run.output,
                        "error": run.error,
                        "interrupt": run.interrupt,
                    },
                    event="end",
                )
                return
            woke = await subscription.wait(min(REREAD_SECONDS, keepalive_seconds))
            idle = 0.0 if woke else idle + min(REREAD_SECONDS, keepalive_seconds)
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
