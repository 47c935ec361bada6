"""Shortcuts for lane tests: one tenant, user and agent; a worker stand-in
that claims and finishes runs through the real store."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from runlane.lane_service import LaneService
from runlane.lanes import LaneSnapshot, Request
from runlane.models import ClaimedRun, Outcome, Run
from runlane.store import RunStore

TENANT, USER, AGENT = "acme", "ann", "bot"


async def submit(
    lanes: LaneService, thread: str, text: str, policy: str = "enqueue", **kwargs: Any
) -> Request:
    request, _ = await lanes.submit(
        tenant=TENANT,
        user_id=USER,
        agent=AGENT,
        thread_id=thread,
        input={"text": text},
        policy=policy,
        **kwargs,
    )
    return request


async def snapshot(lanes: LaneService, thread: str) -> LaneSnapshot:
    return await lanes.snapshot(tenant=TENANT, user_id=USER, agent=AGENT, thread_id=thread)


async def queued_texts(lanes: LaneService, thread: str) -> list[tuple[str, int | None]]:
    snap = await snapshot(lanes, thread)
    return [(r.input["text"], r.position) for r in snap.queued]


async def claim(store: RunStore, run_id: UUID) -> ClaimedRun:
    """Claims runs until it holds ``run_id`` (other lanes' runs are finished
    as completed on the way, which the tests never depend on)."""
    for _ in range(100):
        batch = await store.claim_batch(worker_id="test", limit=1, lease_seconds=30)
        assert batch, f"run {run_id} was not claimable"
        if batch[0].id == run_id:
            return batch[0]
        raise AssertionError(f"claimed {batch[0].id}, expected {run_id}")
    raise AssertionError("unreachable")


async def finish(store: RunStore, claimed: ClaimedRun, outcome: Outcome, **kwargs: Any) -> Run:
    run = await store.finish_attempt(
        claimed.id, claimed.lease_token, outcome, lane_id=claimed.lane_id, **kwargs
    )
    assert run is not None, "lease lost"
    return run


async def run_to_end(store: RunStore, run_id: UUID, outcome: Outcome, **kwargs: Any) -> Run:
    return await finish(store, await claim(store, run_id), outcome, **kwargs)
