"""Lanes under concurrent callers: the lane lock and the unique indexes keep
the rules, whatever the interleaving."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

from runlane.database import create_pool
from runlane.errors import LaneRefused
from runlane.lane_service import LaneService
from runlane.lane_store import LaneStore
from runlane.lanes import RequestStatus
from runlane.models import Outcome
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import RunStore
from tests.integration.lane_helpers import (
    AGENT,
    TENANT,
    USER,
    claim,
    finish,
    run_to_end,
    snapshot,
    submit,
)

Conn = psycopg.Connection[Any]


@pytest.fixture
async def wide_lanes(db_url: str, settings: Settings) -> AsyncIterator[LaneService]:
    """A lane service over a pool wide enough for 50 callers at once."""
    pool = create_pool(db_url, min_size=20, max_size=50)
    await pool.open(wait=True)
    try:
        yield LaneService(LaneStore(pool), RunService(RunStore(pool), settings))
    finally:
        await pool.close()


async def attempt(coro: Any) -> Any:
    try:
        return await coro
    except LaneRefused as exc:
        return exc


async def test_fifty_concurrent_enqueues_dispatch_one_and_queue_the_rest_in_order(
    wide_lanes: LaneService, store: RunStore, service: RunService, sql: Conn
) -> None:
    results = await asyncio.gather(
        *(submit(wide_lanes, "t1", f"m{i}", request_id=f"r{i}") for i in range(50))
    )
    dispatched = [r for r in results if r.status is RequestStatus.DISPATCHED]
    queued = [r for r in results if r.status is RequestStatus.QUEUED]
    assert len(dispatched) == 1 and len(queued) == 49
    server_order = [
        row[0]
        for row in sql.execute(
            "SELECT request_id FROM runlane.requests ORDER BY request_order"
        ).fetchall()
    ]
    snap = await snapshot(wide_lanes, "t1")
    assert [r.request_id for r in snap.queued] == server_order[1:]
    assert [r.position for r in snap.queued] == list(range(1, 50))

    # The runs then execute in exactly that order.
    executed = []
    run_id = dispatched[0].run_id
    while run_id is not None:
        run = await service.get(run_id)
        executed.append(run.input["text"])
        await run_to_end(store, run_id, Outcome.COMPLETED)
        run_id = (await snapshot(wide_lanes, "t1")).run_id
    assert executed == [f"m{rid[1:]}" for rid in server_order]


async def test_twenty_concurrent_steers_leave_exactly_one(
    wide_lanes: LaneService, store: RunStore, sql: Conn
) -> None:
    first = await submit(wide_lanes, "t1", "busy")
    assert first.run_id is not None
    await claim(store, first.run_id)
    results = await asyncio.gather(
        *(attempt(submit(wide_lanes, "t1", f"s{i}", policy="steer")) for i in range(20))
    )
    stored = [r for r in results if not isinstance(r, LaneRefused)]
    refused = [r for r in results if isinstance(r, LaneRefused)]
    assert len(stored) == 1 and stored[0].status is RequestStatus.QUEUED and stored[0].steer
    assert {r.code for r in refused} == {"steer_already_pending"} and len(refused) == 19
    assert sql.execute("SELECT count(*) FROM runlane.requests WHERE steer").fetchone() == (1,)


async def test_twenty_concurrent_rejects_on_an_idle_lane_dispatch_at_most_one(
    wide_lanes: LaneService, sql: Conn
) -> None:
    results = await asyncio.gather(
        *(submit(wide_lanes, "t1", f"x{i}", policy="reject") for i in range(20))
    )
    statuses = [r.status for r in results]
    assert statuses.count(RequestStatus.DISPATCHED) == 1
    assert statuses.count(RequestStatus.REJECTED) == 19
    assert {r.reason for r in results if r.status is RequestStatus.REJECTED} == {"lane_busy"}
    assert sql.execute("SELECT count(*) FROM runlane.runs").fetchone() == (1,)


async def test_cancel_racing_completion_never_both_cancels_and_dispatches(
    wide_lanes: LaneService, store: RunStore, service: RunService
) -> None:
    for round_no in range(15):
        thread = f"race-{round_no}"
        first = await submit(wide_lanes, thread, "one")
        second = await submit(wide_lanes, thread, "two", request_id=f"{thread}-two")
        assert first.run_id is not None and second.status is RequestStatus.QUEUED
        claimed = await claim(store, first.run_id)
        _, cancel = await asyncio.gather(
            finish(store, claimed, Outcome.COMPLETED),
            attempt(wide_lanes.cancel_request(tenant=TENANT, request_id=second.request_id)),
        )
        after = await wide_lanes.get_request(tenant=TENANT, request_id=second.request_id)
        if isinstance(cancel, LaneRefused):
            # Completion won: the relay dispatched it, so it cannot be cancelled.
            assert cancel.code == "request_already_dispatched"
            assert after.status is RequestStatus.DISPATCHED and after.run_id is not None
        else:
            assert after.status is RequestStatus.CANCELLED and after.run_id is None
            assert (await snapshot(wide_lanes, thread)).run_id is None
        # Whatever won, finish the lane's run so the next round claims cleanly.
        active = (await snapshot(wide_lanes, thread)).run_id
        if active is not None:
            await run_to_end(store, active, Outcome.COMPLETED)


async def test_relay_racing_a_new_enqueue_dispatches_it_exactly_once(
    wide_lanes: LaneService, store: RunStore, sql: Conn
) -> None:
    for round_no in range(15):
        thread = f"relay-{round_no}"
        first = await submit(wide_lanes, thread, "one")
        assert first.run_id is not None
        claimed = await claim(store, first.run_id)
        _, newcomer = await asyncio.gather(
            finish(store, claimed, Outcome.COMPLETED),
            submit(wide_lanes, thread, "two"),
        )
        after = await wide_lanes.get_request(tenant=TENANT, request_id=newcomer.request_id)
        assert after.status is RequestStatus.DISPATCHED and after.run_id is not None
        active = sql.execute(
            "SELECT count(*) FROM runlane.runs r JOIN runlane.lanes l ON l.id = r.lane_id"
            " WHERE l.thread_id = %s AND r.status IN ('pending', 'running')",
            (thread,),
        ).fetchone()
        assert active == (1,)
        await run_to_end(store, after.run_id, Outcome.COMPLETED)


async def test_the_same_request_id_submitted_concurrently_is_stored_once(
    wide_lanes: LaneService, sql: Conn
) -> None:
    results = await asyncio.gather(
        *(
            wide_lanes.submit(
                tenant=TENANT,
                user_id=USER,
                agent=AGENT,
                thread_id="t1",
                input={"text": "hi"},
                request_id="same",
            )
            for _ in range(20)
        )
    )
    assert sum(created for _, created in results) == 1
    assert len({request.id for request, _ in results}) == 1
    assert sql.execute("SELECT count(*) FROM runlane.runs").fetchone() == (1,)


async def test_the_same_request_id_submitted_to_many_lanes_at_once_is_stored_once(
    wide_lanes: LaneService, sql: Conn
) -> None:
    # Twenty lanes, twenty lane locks: nothing serialises these submits but
    # the unique request_id, whose violation is caught and looked at again.
    results = await asyncio.gather(
        *(
            attempt(
                wide_lanes.submit(
                    tenant=TENANT,
                    user_id=USER,
                    agent=AGENT,
                    thread_id=f"t{i}",
                    input={"text": "hi"},
                    request_id="same",
                )
            )
            for i in range(20)
        )
    )
    stored = [r for r in results if not isinstance(r, LaneRefused)]
    refused = [r for r in results if isinstance(r, LaneRefused)]
    assert len(stored) == 1 and stored[0][1] is True
    assert len(refused) == 19
    assert {r.code for r in refused} == {"request_id_conflict"}
    # A refusal stores nothing, not even its lane.
    assert sql.execute("SELECT count(*) FROM runlane.lanes").fetchone() == (1,)
    assert sql.execute("SELECT count(*) FROM runlane.requests").fetchone() == (1,)
    assert sql.execute("SELECT count(*) FROM runlane.runs").fetchone() == (1,)
