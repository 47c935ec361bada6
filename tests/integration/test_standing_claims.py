"""Standing claims (migration 0025): an idle worker parks, and a submit
that can start at once hands it the run in the submit's own transaction;
so does a lane's intake on an idle lane (migration 0026)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import psycopg

from runlane import App, RunContext
from runlane.lane_service import LaneService
from runlane.lanes import RequestStatus
from runlane.models import ClaimedRun, RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import ClaimSpec, PushedRun, RunStore
from runlane.worker import Worker
from tests.support import claimed_as_stored, running_worker, wait_until

Conn = psycopg.Connection[Any]


def stand(
    sql: Conn, worker_id: str, agents: list[str] | None, *, lease_seconds: float = 30
) -> None:
    """A standing claim as a worker's short claim leaves it (claim_or_park),
    written directly: a worker that parked and then went away, or one that
    parked before the run now waiting became available."""
    sql.execute(
        "INSERT INTO runlane.standing_claims (worker_id, agents, lease_seconds, expires_at)"
        " VALUES (%s, %s, %s, now() + interval '1 minute')",
        (worker_id, agents, lease_seconds),
    )


def standing_claims(sql: Conn) -> list[tuple[Any, ...]]:
    return sql.execute(
        "SELECT worker_id, run_id FROM runlane.standing_claims ORDER BY worker_id"
    ).fetchall()


async def parked(sql: Conn, worker_id: str) -> None:
    async def found() -> bool:
        return any(w == worker_id and r is None for w, r in standing_claims(sql))

    await wait_until(found, timeout=10, message=f"{worker_id} parked")


def echo_app(settings: Settings, started: list[Any]) -> App:
    app = App(settings)

    @app.agent("echo")
    async def echo(ctx: RunContext) -> Any:
        started.append((ctx.run_id, ctx.attempt))
        return {"echo": ctx.input}

    return app


async def wait_for_status(service: RunService, run_id: Any, status: RunStatus) -> Any:
    async def reached() -> Any:
        run = await service.get(run_id)
        return run if run.status is status else None

    return await wait_until(reached, timeout=15, message=f"run {status}")


async def test_an_idle_worker_is_pushed_the_run_a_submit_stores(
    service: RunService, settings: Settings, sql: Conn
) -> None:
    started: list[Any] = []
    async with running_worker(echo_app(settings, started), settings) as worker:
        await parked(sql, worker.worker_id)
        run, created = await service.submit("echo", {"n": 1})
        # The submit answered the run already claimed by the parked worker.
        assert created and run.status is RunStatus.RUNNING
        assert run.worker_id == worker.worker_id and run.attempts == 1
        done = await wait_for_status(service, run.id, RunStatus.COMPLETED)
        assert worker.claims_pushed == 1
        # It parks again for the next one.
        await parked(sql, worker.worker_id)
        second, _ = await service.submit("echo", {"n": 2})
        assert second.status is RunStatus.RUNNING
        await wait_for_status(service, second.id, RunStatus.COMPLETED)
        assert worker.claims_pushed == 2
    assert done.output == {"echo": {"n": 1}}
    assert started == [(run.id, 1), (second.id, 1)]
    # The attempt row is the one a claim writes, and the run ran once.
    attempts = sql.execute(
        "SELECT attempt, worker_id, outcome FROM runlane.attempts WHERE run_id = %s",
        (run.id,),
    ).fetchall()
    assert attempts == [(1, worker.worker_id, "completed")]
    # A stopped worker withdraws its standing claim.
    assert standing_claims(sql) == []


async def test_a_request_to_an_idle_lane_is_pushed_and_its_lane_keeps_its_order(
    lanes: LaneService, service: RunService, store: RunStore, settings: Settings, sql: Conn
) -> None:
    started: list[Any] = []

    async def submit(tenant: str, text: str) -> Any:
        request, created = await lanes.submit(
            tenant=tenant, user_id="ann", agent="echo", thread_id="t-1", input={"text": text}
        )
        assert created
        return request

    async with running_worker(echo_app(settings, started), settings) as worker:
        await parked(sql, worker.worker_id)
        first = await submit("acme", "first")
        # Dispatched at intake, and given to the parked worker in the same
        # transaction: its first attempt is that worker's.
        assert first.status is RequestStatus.DISPATCHED and first.run_id is not None
        done = await wait_for_status(service, first.run_id, RunStatus.COMPLETED)
        assert worker.claims_pushed == 1
        assert done.output == {"echo": {"text": "first"}} and done.kind == "request"
        # The next requests of the lane still run one at a time, in order,
        # whichever way each reaches the worker.
        later = [await submit("acme", text) for text in ("second", "third", "fourth")]
        runs = []
        for request in later:

            async def dispatched(request: Any = request) -> Any:
                row = sql.execute(
                    "SELECT run_id FROM runlane.requests WHERE id = %s", (request.id,)
                ).fetchone()
                return row[0] if row and row[0] else None

            run_id = await wait_until(dispatched, timeout=15, message="request dispatched")
            runs.append(await wait_for_status(service, run_id, RunStatus.COMPLETED))
        # A capped tenant's request waits for a claim, which counts the cap.
        await store.set_tenant_limit("capped", 5)
        await parked(sql, worker.worker_id)
        pushed_before = worker.claims_pushed
        capped = await submit("capped", "capped")
        assert capped.run_id is not None
        await wait_for_status(service, capped.run_id, RunStatus.COMPLETED)
        assert worker.claims_pushed == pushed_before
    assert [run_id for run_id, _ in started[:4]] == [first.run_id] + [r.id for r in runs]
    assert [r.output["echo"]["text"] for r in runs] == ["second", "third", "fourth"]
    # One at a time: each run of the lane started after the one before ended.
    ordered = [done, *runs]
    for before, after in itertools.pairwise(ordered):
        assert before.finished_at is not None and after.started_at is not None
        assert after.started_at >= before.finished_at
    # Each ran once: one attempt row per run, the worker's.
    attempts = sql.execute(
        "SELECT count(*), count(DISTINCT run_id), min(worker_id), max(worker_id)"
        " FROM runlane.attempts WHERE outcome = 'completed'"
    ).fetchone()
    assert attempts == (5, 5, worker.worker_id, worker.worker_id)


async def test_a_push_never_exceeds_the_workers_concurrency(
    service: RunService, settings: Settings, sql: Conn
) -> None:
    release = asyncio.Event()
    running: list[Any] = []
    most = 0
    app = App(settings)

    @app.agent("slow")
    async def slow(ctx: RunContext) -> Any:
        nonlocal most
        running.append(ctx.run_id)
        most = max(most, len(running))
        await release.wait()
        running.remove(ctx.run_id)
        return "ok"

    async with running_worker(app, settings, concurrency=1) as worker:
        await parked(sql, worker.worker_id)
        first, _ = await service.submit("slow", {})
        assert first.status is RunStatus.RUNNING
        # The only slot is taken: nothing is parked, the next runs wait.
        await wait_until(lambda: running == [first.id], timeout=10, message="first started")
        others = [(await service.submit("slow", {}))[0] for _ in range(3)]
        assert [r.status for r in others] == [RunStatus.PENDING] * 3
        assert standing_claims(sql) in ([], [(worker.worker_id, first.id)])
        release.set()
        for other in others:
            await wait_for_status(service, other.id, RunStatus.COMPLETED)
    assert most == 1


def held_app(settings: Settings, release: asyncio.Event, running: list[Any]) -> App:
    """An agent whose runs stay under way until ``release`` is set."""
    app = App(settings)

    @app.agent("held")
    async def held(ctx: RunContext) -> Any:
        running.append(ctx.run_id)
        await release.wait()
        return "ok"

    @app.agent("quick")
    async def quick(ctx: RunContext) -> Any:
        return "ok"

    return app


@contextlib.asynccontextmanager
async def parked_held_worker(
    service: RunService, settings: Settings, sql: Conn
) -> AsyncIterator[tuple[Worker, asyncio.Event, list[Any]]]:
    """A worker of concurrency 3 whose "held" runs stay under way until
    the event is set, parked after a run that ended at once. Its poll is
    far beyond the test: only a push or a claim may park it again."""
    slow_poll = settings.model_copy(update={"poll_seconds": 120.0})
    release = asyncio.Event()
    running: list[Any] = []
    async with running_worker(
        held_app(slow_poll, release, running), slow_poll, concurrency=3
    ) as worker:
        run, _ = await service.submit("quick", {})
        await wait_for_status(service, run.id, RunStatus.COMPLETED)
        await parked(sql, worker.worker_id)
        yield worker, release, running


async def test_a_busy_worker_with_a_free_slot_is_pushed_the_next_run_too(
    service: RunService, settings: Settings, sql: Conn
) -> None:
    async with parked_held_worker(service, settings, sql) as (worker, release, running):
        worker_id = worker.worker_id
        first, _ = await service.submit("held", {})
        assert first.status is RunStatus.RUNNING
        await wait_until(lambda: running == [first.id], timeout=10, message="first started")
        # The push spent the standing claim; two slots are free, so the
        # worker leaves a new one while the first run goes on.
        await parked(sql, worker_id)
        second, _ = await service.submit("held", {})
        assert second.status is RunStatus.RUNNING and second.worker_id == worker_id
        await parked(sql, worker_id)
        third, _ = await service.submit("held", {})
        assert third.status is RunStatus.RUNNING
        # Every slot is taken now: the standing claim is not left again,
        # and the next run waits for a slot.
        await wait_until(lambda: len(running) == 3, timeout=10, message="three running")
        fourth, _ = await service.submit("held", {})
        assert fourth.status is RunStatus.PENDING
        release.set()
        for run in (first, second, third, fourth):
            await wait_for_status(service, run.id, RunStatus.COMPLETED)


async def test_a_worker_woken_by_a_notify_parks_when_its_claim_comes_back_short(
    service: RunService, settings: Settings, sql: Conn
) -> None:
    async with parked_held_worker(service, settings, sql) as (worker, release, running):
        # A keyed submit is never pushed: it waits pending and its NOTIFY
        # wakes the worker, whose claim takes it and comes back short.
        keyed, _ = await service.submit("held", {}, idempotency_key="k-1")
        assert keyed.status is RunStatus.PENDING
        await wait_until(lambda: running == [keyed.id], timeout=10, message="keyed started")
        # That claim parked the worker again, though a NOTIFY woke it: the
        # next submit is pushed while the keyed run is under way.
        await parked(sql, worker.worker_id)
        pushed_before = worker.claims_pushed
        pushed, _ = await service.submit("held", {})
        assert pushed.status is RunStatus.RUNNING and pushed.worker_id == worker.worker_id
        release.set()
        for run in (keyed, pushed):
            await wait_for_status(service, run.id, RunStatus.COMPLETED)
        assert worker.claims_pushed == pushed_before + 1


async def test_only_runs_that_can_start_now_are_pushed(
    service: RunService, store: RunStore, settings: Settings, sql: Conn
) -> None:
    started: list[Any] = []
    async with running_worker(echo_app(settings, started), settings) as worker:
        await parked(sql, worker.worker_id)
        # Another agent's run, a delayed run and a keyed run wait pending.
        other, _ = await service.submit("someone-elses", {})
        delayed, _ = await service.submit("echo", {}, delay_seconds=3600)
        keyed, _ = await service.submit("echo", {}, idempotency_key="k-1")
        assert other.status is RunStatus.PENDING and delayed.status is RunStatus.PENDING
        assert keyed.status is RunStatus.PENDING
        await wait_for_status(service, keyed.id, RunStatus.COMPLETED)
        # A capped tenant's runs wait for a claim, which counts the cap.
        await store.set_tenant_limit("capped", 5)
        await parked(sql, worker.worker_id)
        capped, _ = await service.submit("echo", {}, tenant="capped")
        assert capped.status is RunStatus.PENDING
        await wait_for_status(service, capped.id, RunStatus.COMPLETED)
        assert worker.claims_pushed == 0
    assert (await service.get(other.id)).status is RunStatus.PENDING
    assert (await service.get(delayed.id)).status is RunStatus.PENDING


async def test_a_run_waiting_before_it_is_not_overtaken(
    service: RunService, store: RunStore, settings: Settings, sql: Conn
) -> None:
    # A standing claim whose worker has not claimed the run already waiting
    # (it became available after the worker's last claim): the new run
    # waits behind it rather than jump the queue.
    waiting, _ = await service.submit("echo", {"first": True})
    stand(sql, "w-1", ["echo"])
    later, _ = await service.submit("echo", {"first": False})
    assert later.status is RunStatus.PENDING
    assert standing_claims(sql) == [("w-1", None)]
    # With nothing of its agent waiting, the next is pushed.
    sql.execute("DELETE FROM runlane.runs")
    pushed, _ = await service.submit("echo", {})
    assert pushed.status is RunStatus.RUNNING and pushed.worker_id == "w-1"
    assert waiting.status is RunStatus.PENDING


async def test_parking_clears_the_claims_of_workers_long_gone(store: RunStore, sql: Conn) -> None:
    for worker_id in ("gone", "recent"):
        stand(sql, worker_id, None)
    sql.execute(
        "UPDATE runlane.standing_claims SET expires_at = now() - interval '2 minutes'"
        " WHERE worker_id = 'gone'"
    )
    sql.execute(
        "UPDATE runlane.standing_claims SET expires_at = now() - interval '10 seconds'"
        " WHERE worker_id = 'recent'"
    )
    # A worker whose claim comes back short parks, and clears them.
    await store.claim(ClaimSpec(worker_id="alive", limit=1, lease_seconds=30, park_seconds=60))
    assert standing_claims(sql) == [("alive", None), ("recent", None)]


async def test_an_expired_standing_claim_takes_no_run(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    stand(sql, "gone", None)
    sql.execute("UPDATE runlane.standing_claims SET expires_at = now() - interval '1 second'")
    run, _ = await service.submit("echo", {})
    assert run.status is RunStatus.PENDING
    assert standing_claims(sql) == [("gone", None)]


async def test_a_run_pushed_to_a_worker_that_died_is_recovered(
    service: RunService, store: RunStore, settings: Settings, sql: Conn
) -> None:
    # A worker parked and died before its claim expired: the run pushed to
    # it is a claimed run of a dead worker; the reaper takes it back when
    # the lease expires and another worker runs it as attempt 2.
    stand(sql, "dead", ["echo"], lease_seconds=1.0)
    run, _ = await service.submit("echo", {})
    assert run.status is RunStatus.RUNNING and run.worker_id == "dead"
    sql.execute("DELETE FROM runlane.standing_claims")
    started: list[Any] = []
    async with running_worker(echo_app(settings, started), settings):
        done = await wait_for_status(service, run.id, RunStatus.COMPLETED)
    assert started == [(run.id, 2)]
    outcomes = sql.execute(
        "SELECT attempt, worker_id, outcome FROM runlane.attempts"
        " WHERE run_id = %s ORDER BY attempt",
        (run.id,),
    ).fetchall()
    assert outcomes[0] == (1, "dead", "lease_expired")
    assert outcomes[1][0] == 2 and outcomes[1][2] == "completed"
    assert done.attempts == 2


async def test_unparking_finds_a_run_whose_notification_was_lost(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    # The NOTIFY only hurries the worker: the claim that unparks answers
    # the pushed run beside what it claims, and claims one run more when
    # no submit took the standing claim (its slot is free again).
    spec = ClaimSpec(
        worker_id="w-1", limit=1, lease_seconds=30, agents=["echo"], unpark=True, park_seconds=60
    )
    assert await store.claim(ClaimSpec(**{**_fields(spec), "unpark": False})) == []
    assert standing_claims(sql) == [("w-1", None)]
    run, _ = await service.submit("echo", {"n": 1})
    spare, _ = await service.submit("echo", {"n": 2})
    assert run.status is RunStatus.RUNNING and spare.status is RunStatus.PENDING
    claimed = await store.claim(spec)
    assert sorted((c.id, c.pushed) for c in claimed) == sorted([(run.id, True), (spare.id, False)])
    pushed = next(c for c in claimed if c.pushed)
    assert pushed.lease_token == run.lease_token
    assert claimed_as_stored(pushed, await service.get(run.id)) == {}
    # It took as many as it asked for: more may wait, so it did not park.
    assert standing_claims(sql) == []
    assert await store.claim(ClaimSpec(**{**_fields(spec), "unpark": False})) == []
    assert standing_claims(sql) == [("w-1", None)]  # it came back short: parked
    more = [(await service.submit("echo", {"n": i}))[0] for i in (3, 4)]
    assert [r.status for r in more] == [RunStatus.RUNNING, RunStatus.PENDING]
    # A stale push reads as nothing; a withdrawn claim answers its run.
    assert await store.get_pushed_run(PushedRun(run.id, spare.id)) is None
    found = await store.unpark("w-1")
    assert found == PushedRun(more[0].id, more[0].lease_token)
    fetched = await store.get_pushed_run(found)
    assert fetched is not None and claimed_as_stored(fetched, await service.get(more[0].id)) == {}
    assert await store.unpark("w-1") is None
    # Unparked with nothing pushed: the claim takes the freed slot too.
    stand(sql, "w-2", ["echo"])
    extra = await store.claim(ClaimSpec(**{**_fields(spec), "worker_id": "w-2", "limit": 0}))
    assert [(c.id, c.pushed) for c in extra] == [(more[1].id, False)]


def _fields(spec: ClaimSpec) -> dict[str, Any]:
    return {f: getattr(spec, f) for f in spec.__dataclass_fields__}


async def test_no_push_without_notifications(db_url: str, sql: Conn, settings: Settings) -> None:
    # A store that sends no NOTIFY pushes nothing: a pushed run's worker
    # would hear of it only at its next poll.
    from runlane.database import create_pool

    pool = create_pool(db_url, min_size=1, max_size=2)
    await pool.open()
    try:
        quiet = RunStore(pool, notify=False)
        stand(sql, "w-1", None)
        service = RunService(quiet, settings)
        run, _ = await service.submit("echo", {})
        assert run.status is RunStatus.PENDING
    finally:
        await pool.close()


async def test_a_pushed_runs_notification_carries_the_run_as_stored(
    service: RunService, lanes: LaneService, sql: Conn, db_url: str
) -> None:
    # What the parked worker starts without reading it: the payload's run,
    # in every field the worker reads, is the run as stored; one too large
    # for a NOTIFY is named only, and read.
    import json

    listener = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    try:
        await listener.execute("LISTEN runlane_push")
        notices = listener.notifies(timeout=10)
        stand(sql, "w-1", None)
        run, _ = await service.submit(
            "echo",
            {"text": "héllo", "n": [1, 2.5, None], "nested": {"b": 1, "a": True}},
            # Columns of one type with values of their own, so that the
            # array's order is checked too.
            tenant="acme",
            user_id="ann",
            budget={"max_seconds": 60},
            metadata={"source": "test"},
        )
        message = json.loads((await anext(notices)).payload)
        assert message["worker_id"] == "w-1"
        # The claim's columns, no more and unnamed: the payload is built and
        # decoded on every pushed run's wake-up.
        assert set(message) == {"worker_id", "claim", "deadline_in_seconds"}
        assert len(message["claim"]) == len(ClaimedRun.__dataclass_fields__) - 2
        pushed = ClaimedRun.from_pushed_claim(message["claim"], message["deadline_in_seconds"])
        assert claimed_as_stored(pushed, await service.get(run.id)) == {}
        assert pushed.pushed and pushed.input == run.input and pushed.budget == run.budget
        assert pushed.deadline_in_seconds is not None and 59 < pushed.deadline_in_seconds <= 60
        stand(sql, "w-2", None)
        big, _ = await service.submit("other", {"text": "x" * 9000})
        message = json.loads((await anext(notices)).payload)
        assert message == {
            "worker_id": "w-2",
            "run_id": str(big.id),
            "lease_token": str(big.lease_token),
        }
        # A lane's run pushed at intake is carried alike (migration 0046).
        stand(sql, "w-3", None)
        request, _ = await lanes.submit(
            tenant="acme", user_id="ann", agent="echo", thread_id="t-1", input={"text": "lane"}
        )
        assert request.run_id is not None
        message = json.loads((await anext(notices)).payload)
        assert set(message) == {"worker_id", "claim", "deadline_in_seconds"}
        pushed = ClaimedRun.from_pushed_claim(message["claim"], message["deadline_in_seconds"])
        assert claimed_as_stored(pushed, await service.get(request.run_id)) == {}
        assert pushed.kind == "request" and pushed.lane_id is not None
    finally:
        await listener.close()


async def test_a_push_the_worker_cannot_read_still_starts_its_run_at_once(
    service: RunService, settings: Settings, sql: Conn
) -> None:
    # A push in a shape of another version (a rolling upgrade: the submit
    # and the worker of different releases) is not lost: the worker takes
    # the run by unparking at once. The poll is a minute away, beyond the
    # wait for the run, so that only the push can have woken it.
    slow_poll = settings.model_copy(update={"poll_seconds": 60.0})
    started: list[Any] = []
    async with running_worker(echo_app(slow_poll, started), slow_poll) as worker:
        # A first run's outcome wakes the claim loop, which then parks.
        # (The first run itself may be pushed or claimed: it is submitted
        # before the new worker has surely parked.)
        first, _ = await service.submit("echo", {"text": "first"})
        await wait_for_status(service, first.id, RunStatus.COMPLETED)
        await parked(sql, worker.worker_id)
        pushed_before = worker.claims_pushed

        def push_of_another_shape() -> Any:
            # The standing claim is taken with SKIP LOCKED, as a submit
            # takes it: while the worker parks again (its row locked for
            # that moment) it is not there to take, and the run is not
            # pushed. Tried again until it is.
            with sql.transaction():
                row = sql.execute(
                    "WITH s AS (SELECT * FROM runlane.take_standing_claim('default', 'echo',"
                    " true))"
                    " INSERT INTO runlane.runs (id, agent, input, max_attempts, status,"
                    "   attempts, claim_count, lease_token, lease_expires_at, worker_id,"
                    "   started_at, attempt_started_at)"
                    " SELECT s.run_id, 'echo', '{\"text\": \"later\"}', 3, 'running', 1, 1,"
                    "   s.lease_token, now() + make_interval(secs => s.lease_seconds),"
                    "   s.worker_id, now(), now() FROM s"
                    " RETURNING id, worker_id"
                ).fetchone()
                if row is not None:
                    sql.execute(
                        "SELECT pg_notify('runlane_push', json_build_object("
                        "  'worker_id', %s::text, 'shape', 'of a later version')::text)",
                        (row[1],),
                    )
            return row

        row = await wait_until(push_of_another_shape, timeout=10, message="a push")
        assert row[1] == worker.worker_id
        done = await wait_for_status(service, row[0], RunStatus.COMPLETED)
        assert worker.claims_pushed == pushed_before + 1
    assert done.output == {"echo": {"text": "later"}}
    assert started == [(first.id, 1), (row[0], 1)]


async def test_a_pushed_run_too_large_to_carry_is_read_and_run(
    service: RunService, settings: Settings, sql: Conn
) -> None:
    started: list[Any] = []
    async with running_worker(echo_app(settings, started), settings) as worker:
        await parked(sql, worker.worker_id)
        run, _ = await service.submit("echo", {"text": "x" * 9000})
        assert run.status is RunStatus.RUNNING
        done = await wait_for_status(service, run.id, RunStatus.COMPLETED)
        assert worker.claims_pushed == 1
    assert done.output == {"echo": {"text": "x" * 9000}}
    assert started == [(run.id, 1)]
