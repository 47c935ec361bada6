"""Events of many runs appended in one statement (``runlane.append_events``,
migration 0036; ``runlane.event_batches``): each run's seq stays gap-free
and in emit order, each event stays fenced by its own lease token, and one
event the database refuses fails only its own emit."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from runlane import App, RunContext
from runlane.event_batches import EventBatcher
from runlane.models import ClaimedRun, Outcome, RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import EventAppend, Finish, RunStore
from tests.support import running_worker, wait_until


async def claim(store: RunStore, agent: str, n: int) -> list[ClaimedRun]:
    claimed = await store.claim_batch(worker_id="test", limit=n, lease_seconds=30, agents=[agent])
    assert len(claimed) == n
    return claimed


async def event_rows(store: RunStore, run_id: Any) -> list[tuple[int, str, Any, int | None]]:
    return [(e.seq, e.kind, e.data, e.attempt) for e in await store.list_events(run_id)]


async def test_a_batch_numbers_each_runs_events_in_the_order_given(
    store: RunStore, service: RunService
) -> None:
    for _ in range(2):
        await service.submit("streamer", {})
    first, second = await claim(store, "streamer", 2)
    # One event already there: the batch continues the run's numbering.
    assert await store.append_event(first.id, first.lease_token, "start", {}) == 1
    given = [
        EventAppend(first.id, first.lease_token, "token", {"i": 0}),
        EventAppend(second.id, second.lease_token, "token", {"i": 0}),
        EventAppend(first.id, first.lease_token, "token", {"i": 1}),
        EventAppend(first.id, first.lease_token, "token", {"i": 2}),
        EventAppend(second.id, second.lease_token, "token", {"i": 1}),
    ]
    assert await store.append_events(given) == [2, 1, 3, 4, 2]
    assert await event_rows(store, first.id) == [
        (1, "start", {}, 1),
        (2, "token", {"i": 0}, 1),
        (3, "token", {"i": 1}, 1),
        (4, "token", {"i": 2}, 1),
    ]
    assert await event_rows(store, second.id) == [
        (1, "token", {"i": 0}, 1),
        (2, "token", {"i": 1}, 1),
    ]
    assert await store.append_events([]) == []


async def test_a_stale_token_appends_nothing_and_its_neighbours_are_kept(
    store: RunStore, service: RunService
) -> None:
    run, _ = await service.submit("streamer", {})
    (old,) = await claim(store, "streamer", 1)
    await store.finish_attempts_status([Finish(run.id, old.lease_token, Outcome.RELEASED)])
    (new,) = await claim(store, "streamer", 1)
    assert new.id == run.id and new.lease_token != old.lease_token
    seqs = await store.append_events(
        [
            EventAppend(run.id, old.lease_token, "token", {"from": "old"}),
            EventAppend(run.id, new.lease_token, "token", {"from": "new"}),
            EventAppend(run.id, old.lease_token, "token", {"from": "old"}),
            EventAppend(run.id, new.lease_token, "token", {"from": "new", "n": 2}),
        ]
    )
    assert seqs == [None, 1, None, 2]
    assert await event_rows(store, run.id) == [
        (1, "token", {"from": "new"}, 2),
        (2, "token", {"from": "new", "n": 2}, 2),
    ]


async def test_an_event_the_database_refuses_fails_only_its_own_emit(
    store: RunStore, service: RunService
) -> None:
    for _ in range(3):
        await service.submit("streamer", {})
    good, bad, unjsonable = await claim(store, "streamer", 3)
    batcher = EventBatcher(store)
    # Emitted in the same tick: one batch, refused as a whole, then one by one.
    results = await asyncio.gather(
        batcher.append(good.id, good.lease_token, "token", {"text": "fine"}),
        # PostgreSQL's jsonb holds no NUL character.
        batcher.append(bad.id, bad.lease_token, "token", {"text": "nul \u0000 here"}),
        batcher.append(unjsonable.id, unjsonable.lease_token, "token", {"x": object()}),
        batcher.append(good.id, good.lease_token, "token", {"text": "still fine"}),
        return_exceptions=True,
    )
    assert results[0] == 1 and results[3] == 2
    assert isinstance(results[1], psycopg.DataError)
    assert isinstance(results[2], TypeError)
    assert [data for _, _, data, _ in await event_rows(store, good.id)] == [
        {"text": "fine"},
        {"text": "still fine"},
    ]
    assert await store.list_events(bad.id) == []
    assert await store.list_events(unjsonable.id) == []
    # The refused events took no seq: the runs' next events are their first.
    assert await batcher.append(bad.id, bad.lease_token, "token", {}) == 1
    assert await batcher.append(unjsonable.id, unjsonable.lease_token, "token", {}) == 1


async def test_runs_streaming_at_once_keep_every_event_in_order(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)
    runs, tokens = 40, 25

    @app.agent("streamer")
    async def streamer(ctx: RunContext) -> Any:
        seqs = [await ctx.emit("token", {"i": i}) for i in range(tokens)]
        return {"seqs": seqs}

    submitted = [(await service.submit("streamer", {}))[0] for _ in range(runs)]
    async with running_worker(app, settings, concurrency=runs) as worker:

        async def all_completed() -> bool:
            got = [await service.get(run.id) for run in submitted]
            return all(run.status is RunStatus.COMPLETED for run in got)

        await wait_until(all_completed, timeout=60, message="every run completed")
        batches = worker.events.batches
    for run in submitted:
        done = await service.get(run.id)
        # Each emit answered its own event's seq, once committed.
        assert done.output == {"seqs": list(range(1, tokens + 1))}
        events = await service.events(run.id)
        assert [(e.seq, e.data) for e in events] == [(i + 1, {"i": i}) for i in range(tokens)]
    # Runs that stream at once share statements: far fewer than one per event.
    assert batches < runs * tokens / 2
