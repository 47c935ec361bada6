"""The worker's narrow finish (``RunStore.finish_attempts_status``, which
answers only id and status) against the full-row ``finish_attempts`` and the
table, and batches that mix direct runs with several lanes' runs in one
transaction."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from runlane.lane_service import LaneService
from runlane.models import ClaimedRun, Outcome, RunStatus
from runlane.service import RunService
from runlane.store import Finish, RunStore
from tests.integration.lane_helpers import AGENT, submit


async def claim_one(store: RunStore, agent: str) -> ClaimedRun:
    batch = await store.claim_batch(worker_id="test", limit=1, lease_seconds=30, agents=[agent])
    assert len(batch) == 1
    return batch[0]


@pytest.mark.parametrize(
    ("outcome", "max_attempts", "cancel_first", "expected"),
    [
        (Outcome.COMPLETED, 3, False, RunStatus.COMPLETED),
        (Outcome.FAILED, 3, False, RunStatus.FAILED),
        (Outcome.CANCELLED, 3, False, RunStatus.CANCELLED),
        (Outcome.RETRY, 3, False, RunStatus.PENDING),
        (Outcome.RETRY, 1, False, RunStatus.DEAD),
        (Outcome.RELEASED, 3, False, RunStatus.PENDING),
        (Outcome.STEERED, 3, False, RunStatus.COMPLETED),
        (Outcome.INTERRUPTED, 3, False, RunStatus.INTERRUPTED),
        (Outcome.RETRY, 3, True, RunStatus.CANCELLED),
        (Outcome.COMPLETED, 3, True, RunStatus.COMPLETED),
    ],
)
async def test_the_narrow_finish_ends_runs_like_the_full_one(
    store: RunStore,
    service: RunService,
    outcome: Outcome,
    max_attempts: int,
    cancel_first: bool,
    expected: RunStatus,
) -> None:
    ended: dict[str, Any] = {}
    for variant in ("full", "narrow"):
        agent = f"a-{variant}"
        run, _ = await service.submit(agent, {}, max_attempts=max_attempts)
        claimed = await claim_one(store, agent)
        if cancel_first:
            await service.cancel(run.id)
        finish = Finish(run.id, claimed.lease_token, outcome, output={"ok": 1}, error=None)
        if variant == "full":
            full = await store.finish_attempts([finish])
            ended[variant] = full[run.id].status
        else:
            narrow = await store.finish_attempts_status([finish])
            ended[variant] = narrow[run.id]
        after = await service.get(run.id)
        assert after.status is expected
        attempts = await store.list_attempts(run.id)
        assert attempts[-1].ended_at is not None and attempts[-1].outcome == str(outcome)
    assert ended == {"full": expected, "narrow": expected}


async def test_a_stale_token_changes_nothing_and_is_not_answered(
    store: RunStore, service: RunService
) -> None:
    run, _ = await service.submit("bot", {})
    claimed = await claim_one(store, "bot")
    fresh = await store.finish_attempts_status(
        [Finish(run.id, claimed.lease_token, Outcome.RELEASED)]
    )
    assert fresh == {run.id: RunStatus.PENDING}
    again = await claim_one(store, "bot")
    stale = await store.finish_attempts_status(
        [Finish(run.id, claimed.lease_token, Outcome.COMPLETED, output=1)]
    )
    assert stale == {}
    assert (await service.get(run.id)).status is RunStatus.RUNNING
    assert again.lease_token != claimed.lease_token


async def test_one_batch_ends_runs_of_several_lanes_and_relays_each(
    store: RunStore, service: RunService, lanes: LaneService
) -> None:
    threads = [f"t{i}" for i in range(5)]
    for thread in threads:
        for text in ("first", "second"):
            await submit(lanes, thread, text)
    direct, _ = await service.submit(AGENT, {"direct": True})
    claimed = await store.claim_batch(worker_id="test", limit=50, lease_seconds=30)
    # The five lanes' heads and the direct run; the second requests queue.
    assert len(claimed) == 6
    finishes = [
        Finish(c.id, c.lease_token, Outcome.COMPLETED, output=None, lane_id=c.lane_id)
        for c in reversed(claimed)  # any order: the store locks lanes by id
    ]
    ended = await store.finish_attempts_status(finishes)
    assert ended == {c.id: RunStatus.COMPLETED for c in claimed}
    # Each lane relayed in that transaction: its second request is a run now.
    relayed = await store.claim_batch(worker_id="test", limit=50, lease_seconds=30)
    assert sorted(c.input["text"] for c in relayed) == ["second"] * 5
    assert {c.lane_id for c in relayed} == {c.lane_id for c in claimed if c.lane_id}
    assert direct.id in ended


async def test_concurrent_lane_batches_and_submits_do_not_deadlock(
    store: RunStore, service: RunService, lanes: LaneService
) -> None:
    """Batches lock their lanes in id order before any run, like every lane
    writer: batches of overlapping lane sets never deadlock with each other
    nor with submits into the same lanes."""
    threads = [f"t{i}" for i in range(12)]
    for thread in threads:
        await submit(lanes, thread, "head")
    claimed = await store.claim_batch(worker_id="test", limit=50, lease_seconds=30)
    assert len(claimed) == len(threads)
    halves = [claimed[::2], claimed[1::2][::-1]]

    async def finish_batch(part: list[ClaimedRun]) -> dict[Any, RunStatus]:
        return await store.finish_attempts_status(
            [Finish(c.id, c.lease_token, Outcome.COMPLETED, lane_id=c.lane_id) for c in part]
        )

    async def submits() -> None:
        for thread in reversed(threads):
            await submit(lanes, thread, "next")

    results = await asyncio.wait_for(
        asyncio.gather(finish_batch(halves[0]), finish_batch(halves[1]), submits()), timeout=30
    )
    assert len(results[0]) + len(results[1]) == len(threads)
    # Every lane ends with its "next" request running or queued, none lost.
    following = await store.claim_batch(worker_id="test", limit=50, lease_seconds=30)
    assert sorted(c.input["text"] for c in following) == ["next"] * len(threads)


@pytest.mark.parametrize(
    ("outcome", "wakes"),
    [(Outcome.RELEASED, True), (Outcome.RETRY, False), (Outcome.COMPLETED, False)],
)
async def test_a_run_pending_again_at_once_wakes_its_agents_workers(
    store: RunStore, service: RunService, db_url: str, outcome: Outcome, wakes: bool
) -> None:
    # A released run (a worker shutting down) is claimable at once, so the
    # outcome write tells listening workers of its agent; a retry waits its
    # backoff and a completed run has nothing left to claim.
    agent = f"wake-{outcome.value}"
    run, _ = await service.submit(agent, {})
    claimed = await claim_one(store, agent)
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN runlane_wakeup")
        statuses = await store.finish_attempts_status(
            [Finish(run.id, claimed.lease_token, outcome)]
        )
        assert run.id in statuses
        # Notifications arrive in commit order: whatever the write sent
        # comes before this marker.
        listener.execute("SELECT pg_notify('runlane_wakeup', 'marker')")
        payloads = []
        for notification in listener.notifies(timeout=10):
            payloads.append(notification.payload)
            if notification.payload == "marker":
                break
    assert payloads[-1] == "marker", payloads
    assert (agent in payloads) is wakes, payloads


async def test_each_run_of_a_batch_gets_only_its_own_values(
    store: RunStore, service: RunService
) -> None:
    # A column that is NULL for the whole batch goes as one NULL array;
    # one value in it must land on its own run, in whichever position.
    runs = [(await service.submit("mix", {"i": i}))[0] for i in range(4)]
    claimed = await store.claim_batch(worker_id="test", limit=4, lease_seconds=30, agents=["mix"])
    token = {c.id: c.lease_token for c in claimed}
    first, second, third, fourth = (run.id for run in runs)
    batch = [
        Finish(first, token[first], Outcome.COMPLETED),
        Finish(second, token[second], Outcome.COMPLETED, output={"n": 2}),
        Finish(third, token[third], Outcome.RETRY, retry_delay_seconds=600),
        Finish(
            fourth,
            token[fourth],
            Outcome.INTERRUPTED,
            interrupt={"ask": "ok?"},
            interrupt_expires_in=3600,
        ),
    ]
    assert await store.finish_attempts_status(batch) == {
        first: RunStatus.COMPLETED,
        second: RunStatus.COMPLETED,
        third: RunStatus.PENDING,
        fourth: RunStatus.INTERRUPTED,
    }
    ended = {run_id: await service.get(run_id) for run_id in (first, second, third, fourth)}
    assert [ended[first].output, ended[second].output] == [None, {"n": 2}]
    assert ended[first].error is None and ended[second].error is None
    assert ended[third].available_at > ended[third].created_at + timedelta(seconds=590)
    assert ended[fourth].interrupt == {"ask": "ok?"}
    assert ended[fourth].interrupt_expires_at is not None
    assert [ended[r].interrupt for r in (first, second, third)] == [None, None, None]
    # A batch of nothing but plain completions: every column but the
    # outcomes goes as NULL.
    more = [(await service.submit("plain", {}))[0] for _ in range(3)]
    plain = await store.claim_batch(worker_id="test", limit=3, lease_seconds=30, agents=["plain"])
    done = await store.finish_attempts_status(
        [Finish(c.id, c.lease_token, Outcome.COMPLETED) for c in plain]
    )
    assert done == {run.id: RunStatus.COMPLETED for run in more}


async def test_a_batch_keeps_json_that_needs_escaping_and_mixed_number_types(
    store: RunStore, service: RunService
) -> None:
    # The batch's arrays go in binary: the values must land as given, with
    # quotes, backslashes, braces, non-ASCII text, and delays given as int
    # beside delays given as float.
    tricky = {"say": 'He said "hi" \\ {NULL}, ok', "emoji": "żółw 🐢", "n": [1, 2.5, None]}
    runs = [(await service.submit("esc", {"i": i}))[0] for i in range(5)]
    claimed = await store.claim_batch(worker_id="test", limit=5, lease_seconds=30, agents=["esc"])
    token = {c.id: c.lease_token for c in claimed}
    done, text, slow, fast, asked = (run.id for run in runs)
    statuses = await store.finish_attempts_status(
        [
            Finish(done, token[done], Outcome.COMPLETED, output=tricky),
            Finish(text, token[text], Outcome.COMPLETED, output='a "quoted" string'),
            Finish(
                slow,
                token[slow],
                Outcome.RETRY,
                error={"message": 'bad "input" \\n'},
                retry_delay_seconds=600,
            ),
            Finish(fast, token[fast], Outcome.RETRY, retry_delay_seconds=0.5),
            Finish(
                asked,
                token[asked],
                Outcome.INTERRUPTED,
                interrupt=["a", "b"],
                interrupt_expires_in=60,
            ),
        ]
    )
    assert statuses == {
        done: RunStatus.COMPLETED,
        text: RunStatus.COMPLETED,
        slow: RunStatus.PENDING,
        fast: RunStatus.PENDING,
        asked: RunStatus.INTERRUPTED,
    }
    ended = {run_id: await service.get(run_id) for run_id in (done, text, slow, fast, asked)}
    assert ended[done].output == tricky
    assert ended[text].output == 'a "quoted" string'
    assert ended[slow].available_at > ended[slow].created_at + timedelta(seconds=590)
    assert ended[fast].available_at < ended[fast].created_at + timedelta(seconds=30)
    assert (await store.list_attempts(slow))[-1].error == {"message": 'bad "input" \\n'}
    assert ended[asked].interrupt == ["a", "b"]
    expires = ended[asked].interrupt_expires_at
    assert expires is not None and expires < ended[asked].created_at + timedelta(seconds=120)
