from __future__ import annotations

from runlane.models import Outcome, RunStatus
from runlane.service import RunService
from runlane.store import RunStore


async def test_submit_claim_complete(service: RunService, store: RunStore) -> None:
    run, created = await service.submit("echo", {"x": 1})
    assert created and run.status is RunStatus.PENDING
    batch = await store.claim_batch(worker_id="w1", limit=5, lease_seconds=10)
    assert [c.run.id for c in batch] == [run.id]
    claimed = batch[0]
    assert claimed.run.attempts == 1
    seq = await store.append_event(run.id, claimed.lease_token, "token", {"t": "a"})
    assert seq == 1
    held = await store.renew_leases([(run.id, claimed.lease_token)], lease_seconds=10)
    assert held == {run.id: RunStatus.RUNNING}
    done = await store.finish_attempt(
        run.id, claimed.lease_token, Outcome.COMPLETED, output={"ok": True}
    )
    assert done is not None and done.status is RunStatus.COMPLETED and done.output == {"ok": True}
    again = await store.finish_attempt(
        run.id, claimed.lease_token, Outcome.COMPLETED, output={"ok": 2}
    )
    assert again is None
