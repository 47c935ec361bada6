"""The API's event hub: which streams a notification wakes."""

from __future__ import annotations

import asyncio

from runlane.event_hub import EventHub
from runlane.models import Outcome, RunStatus
from runlane.service import RunService
from runlane.store import Finish, RunStore


async def test_a_batch_of_outcomes_wakes_the_stream_of_every_run_it_ended(
    service: RunService, store: RunStore, db_url: str
) -> None:
    # A worker writes its outcomes in batches, and the batch names every
    # run it ended in one notification (migration 0047). Each of those
    # runs' streams must hear of it at once, not at its periodic re-read
    # (set far beyond the wait here).
    runs = [(await service.submit("a", {}))[0] for _ in range(3)]
    hub = EventHub(db_url, store.pool, reread_seconds=600)
    await hub.start()
    try:
        await asyncio.wait_for(hub.listener.connected.wait(), 10)
        subscriptions = [hub.subscribe_run(run.id) for run in runs]
        claimed = await store.claim_batch(worker_id="w", limit=3, lease_seconds=30)
        assert {c.id for c in claimed} == {run.id for run in runs}
        ended = await store.finish_attempts_status(
            [Finish(c.id, c.lease_token, Outcome.COMPLETED) for c in claimed]
        )
        assert set(ended.values()) == {RunStatus.COMPLETED}
        woken = await asyncio.wait_for(
            asyncio.gather(*(s.wait(timeout=10) for s in subscriptions)), 15
        )
        assert woken == [True, True, True]
        # One notification named the three.
        assert hub.notifications == 1
    finally:
        await hub.stop()
