"""The rules of lanes (issue: Lanes), on a real PostgreSQL."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from runlane.errors import LaneRefused, NotFound, RunFinished
from runlane.lane_service import LaneService
from runlane.lane_store import RECOVERY_LOCK_KEY, RecoveryResult
from runlane.lanes import LaneState, RequestStatus
from runlane.models import Outcome, RunStatus
from runlane.queries import named_queries
from runlane.service import RunService
from runlane.store import RunStore
from tests.integration.lane_helpers import (
    AGENT,
    TENANT,
    USER,
    claim,
    finish,
    queued_texts,
    run_to_end,
    snapshot,
    submit,
)

Conn = psycopg.Connection[Any]


async def expect_refusal(code: str, coro: Any) -> LaneRefused:
    with pytest.raises(LaneRefused) as info:
        await coro
    assert info.value.code == code, info.value
    return info.value


# -- requests and runs ------------------------------------------------------


async def test_idle_lane_dispatches_at_once(lanes: LaneService, service: RunService) -> None:
    request = await submit(lanes, "t1", "hello")
    assert request.status is RequestStatus.DISPATCHED and request.position is None
    assert request.run_id is not None
    run = await service.get(request.run_id)
    assert run.status is RunStatus.PENDING and run.input == {"text": "hello"}
    assert (run.thread_id, run.kind, run.request_id) == ("t1", "request", request.id)
    snap = await snapshot(lanes, "t1")
    assert snap.state is LaneState.RUNNING and snap.run_id == run.id


async def test_busy_lane_queues_in_server_order_and_no_run_exists_for_queued(
    lanes: LaneService, sql: Conn
) -> None:
    first = await submit(lanes, "t1", "one")
    second = await submit(lanes, "t1", "two")
    third = await submit(lanes, "t1", "three")
    assert (second.status, second.position, second.run_id) == (RequestStatus.QUEUED, 1, None)
    assert (third.status, third.position) == (RequestStatus.QUEUED, 2)
    assert await queued_texts(lanes, "t1") == [("two", 1), ("three", 2)]
    # Queued input never enters a run: only the head has one.
    runs = sql.execute("SELECT input->>'text' FROM runlane.runs").fetchall()
    assert runs == [("one",)]
    assert first.run_id is not None


async def test_other_lanes_run_in_parallel(lanes: LaneService) -> None:
    a = await submit(lanes, "t1", "a")
    b = await submit(lanes, "t2", "b")
    other_user, _ = await lanes.submit(
        tenant=TENANT, user_id="bob", agent=AGENT, thread_id="t1", input={"text": "c"}
    )
    assert a.status is b.status is other_user.status is RequestStatus.DISPATCHED


async def test_completed_run_relays_the_next_head_in_order(
    lanes: LaneService, store: RunStore, service: RunService
) -> None:
    first = await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two")
    await submit(lanes, "t1", "three")
    assert first.run_id is not None
    await run_to_end(store, first.run_id, Outcome.COMPLETED, output="r1")
    snap = await snapshot(lanes, "t1")
    assert snap.state is LaneState.RUNNING
    second_run = await service.get(snap.run_id)  # type: ignore[arg-type]
    assert second_run.input == {"text": "two"}
    assert await queued_texts(lanes, "t1") == [("three", 1)]
    await run_to_end(store, second_run.id, Outcome.COMPLETED, output="r2")
    third = (await snapshot(lanes, "t1")).run_id
    assert third is not None
    await run_to_end(store, third, Outcome.COMPLETED, output="r3")
    assert (await snapshot(lanes, "t1")).state is LaneState.IDLE


async def test_a_retried_run_keeps_its_lane_busy(lanes: LaneService, store: RunStore) -> None:
    first = await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two")
    assert first.run_id is not None
    after = await run_to_end(store, first.run_id, Outcome.RETRY, retry_delay_seconds=30)
    assert after.status is RunStatus.PENDING
    snap = await snapshot(lanes, "t1")
    assert snap.state is LaneState.RUNNING and snap.run_id == first.run_id
    assert await queued_texts(lanes, "t1") == [("two", 1)]


# -- reject ---------------------------------------------------------------------


async def test_reject_dispatches_only_on_an_idle_lane(lanes: LaneService) -> None:
    ok = await submit(lanes, "t1", "one", policy="reject")
    assert ok.status is RequestStatus.DISPATCHED
    busy = await submit(lanes, "t1", "two", policy="reject")
    assert (busy.status, busy.reason, busy.run_id) == (RequestStatus.REJECTED, "lane_busy", None)
    # Rejection is a stored, normal result: it can be read back.
    again = await lanes.get_request(tenant=TENANT, request_id=busy.request_id)
    assert again.status is RequestStatus.REJECTED


async def test_reject_on_a_paused_lane(lanes: LaneService, store: RunStore) -> None:
    first = await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two")
    assert first.run_id is not None
    await run_to_end(store, first.run_id, Outcome.FAILED, error={"code": "x"})
    rejected = await submit(lanes, "t1", "three", policy="reject")
    assert (rejected.status, rejected.reason) == (RequestStatus.REJECTED, "lane_paused")


async def test_reject_while_queue_not_empty(lanes: LaneService, sql: Conn) -> None:
    await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two")
    # Leave the lane idle with a queue, as only a crash could.
    sql.execute("SET session_replication_role = replica")  # bypass the relay trigger
    sql.execute("UPDATE runlane.runs SET status = 'completed', finished_at = now()")
    sql.execute("SET session_replication_role = origin")
    rejected = await submit(lanes, "t1", "three", policy="reject")
    assert (rejected.status, rejected.reason) == (RequestStatus.REJECTED, "queue_not_empty")


# -- steer ----------------------------------------------------------------------


async def test_steer_on_idle_lane_dispatches(lanes: LaneService) -> None:
    steer = await submit(lanes, "t1", "s", policy="steer")
    assert steer.status is RequestStatus.DISPATCHED and steer.steer


async def test_steer_goes_first_and_the_running_run_yields(
    lanes: LaneService, store: RunStore, service: RunService
) -> None:
    first = await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two")
    assert first.run_id is not None
    claimed = await claim(store, first.run_id)
    steer = await submit(lanes, "t1", "stop that", policy="steer")
    assert (steer.status, steer.position) == (RequestStatus.QUEUED, 1)
    assert await queued_texts(lanes, "t1") == [("stop that", 1), ("two", 2)]
    # The running run learns of it with its heartbeat.
    held = await store.renew_leases([(first.run_id, claimed.lease_token)], lease_seconds=30)
    assert held[first.run_id].steer_requested
    done = await finish(store, claimed, Outcome.STEERED)
    assert done.status is RunStatus.COMPLETED and done.outcome == "steered"
    snap = await snapshot(lanes, "t1")
    steer_run = await service.get(snap.run_id)  # type: ignore[arg-type]
    assert steer_run.input == {"text": "stop that"}
    assert await queued_texts(lanes, "t1") == [("two", 1)]


async def test_a_run_not_started_yet_yields_to_a_steer_at_its_first_safe_point(
    lanes: LaneService, store: RunStore, service: RunService
) -> None:
    first = await submit(lanes, "t1", "one")
    steer = await submit(lanes, "t1", "instead", policy="steer")
    assert (steer.status, steer.position) == (RequestStatus.QUEUED, 1)
    assert first.run_id is not None
    asked = await service.get(first.run_id)
    assert asked.status is RunStatus.PENDING and asked.steer_requested_at is not None
    # The worker that claims it learns of the steer at once.
    claimed = await claim(store, first.run_id)
    held = await store.renew_leases([(first.run_id, claimed.lease_token)], lease_seconds=30)
    assert held[first.run_id].steer_requested
    await finish(store, claimed, Outcome.STEERED)
    dispatched = await lanes.get_request(tenant=TENANT, request_id=steer.request_id)
    assert dispatched.status is RequestStatus.DISPATCHED


async def test_a_second_queued_steer_is_refused_and_stores_nothing(
    lanes: LaneService, store: RunStore, sql: Conn
) -> None:
    first = await submit(lanes, "t1", "one")
    assert first.run_id is not None
    await claim(store, first.run_id)
    await submit(lanes, "t1", "s1", policy="steer")
    await expect_refusal("steer_already_pending", submit(lanes, "t1", "s2", policy="steer"))
    assert sql.execute("SELECT count(*) FROM runlane.requests").fetchone() == (2,)


async def test_unique_index_holds_one_queued_steer_even_if_code_is_wrong(
    lanes: LaneService, store: RunStore, sql: Conn
) -> None:
    first = await submit(lanes, "t1", "one")
    assert first.run_id is not None
    await claim(store, first.run_id)
    await submit(lanes, "t1", "s1", policy="steer")
    two = await submit(lanes, "t1", "two")
    with pytest.raises(psycopg.errors.UniqueViolation):
        sql.execute("UPDATE runlane.requests SET steer = true WHERE id = %s", (two.id,))


async def test_unique_index_holds_one_active_run_even_if_code_is_wrong(
    lanes: LaneService, sql: Conn
) -> None:
    await submit(lanes, "t1", "one")
    with pytest.raises(psycopg.errors.UniqueViolation):
        sql.execute(
            "INSERT INTO runlane.runs (agent, input, max_attempts, lane_id, kind)"
            " SELECT agent, input, 3, lane_id, 'request' FROM runlane.runs"
        )


async def test_promote_to_steer_and_idempotent_original_submission(
    lanes: LaneService, store: RunStore
) -> None:
    first = await submit(lanes, "t1", "one")
    assert first.run_id is not None
    claimed = await claim(store, first.run_id)
    await submit(lanes, "t1", "two")
    three = await submit(lanes, "t1", "three", request_id="req-3")
    promoted = await lanes.promote_to_steer(tenant=TENANT, request_id="req-3")
    assert promoted.steer and promoted.position == 1
    assert await queued_texts(lanes, "t1") == [("three", 1), ("two", 2)]
    held = await store.renew_leases([(first.run_id, claimed.lease_token)], lease_seconds=30)
    assert held[first.run_id].steer_requested
    # Retrying the original (enqueue) submission returns the same request.
    replay, created = await lanes.submit(
        tenant=TENANT,
        user_id=USER,
        agent=AGENT,
        thread_id="t1",
        input={"text": "three"},
        policy="enqueue",
        request_id="req-3",
    )
    assert not created and replay.id == three.id and replay.steer
    # The steer the running run was asked to yield to cannot be cancelled.
    await expect_refusal(
        "steer_in_progress", lanes.cancel_request(tenant=TENANT, request_id="req-3")
    )
    # A second promotion in the lane is refused.
    two = (await snapshot(lanes, "t1")).queued[1]
    await expect_refusal(
        "steer_already_pending", lanes.promote_to_steer(tenant=TENANT, request_id=two.request_id)
    )


# -- idempotency ------------------------------------------------------------------


async def test_same_request_id_returns_the_existing_request_and_run(
    lanes: LaneService, sql: Conn
) -> None:
    first = await submit(lanes, "t1", "hi", request_id="r-1")
    again, created = await lanes.submit(
        tenant=TENANT,
        user_id=USER,
        agent=AGENT,
        thread_id="t1",
        input={"text": "hi"},
        request_id="r-1",
    )
    assert not created and again.id == first.id and again.run_id == first.run_id
    assert sql.execute("SELECT count(*) FROM runlane.runs").fetchone() == (1,)


async def test_a_request_id_seen_again_uses_up_no_request_order(
    lanes: LaneService, sql: Conn
) -> None:
    """The intake takes the next order in the lane's upsert (migration
    0048); a request_id seen before gives it back, so the lane's count of
    orders is what it was before the repeat."""
    await submit(lanes, "t1", "one", request_id="r-1")
    await submit(lanes, "t1", "two", request_id="r-2")
    for _ in range(3):
        await submit(lanes, "t1", "two", request_id="r-2")
    third = await submit(lanes, "t1", "three", request_id="r-3")
    assert sql.execute("SELECT last_request_order FROM runlane.lanes").fetchall() == [(3,)]
    assert sql.execute(
        "SELECT request_id, request_order FROM runlane.requests ORDER BY request_order"
    ).fetchall() == [("r-1", 1), ("r-2", 2), ("r-3", 3)]
    assert (third.status, third.position) == (RequestStatus.QUEUED, 2)


async def test_each_submit_answers_the_request_as_it_is_stored(
    lanes: LaneService, sql: Conn
) -> None:
    """The intake builds its answer from what it wrote instead of reading
    the request back (migration 0048): in every branch, the answer is the
    request as a read right after it finds it, position and run included."""

    async def submitted(thread: str, text: str, request_id: str, policy: str = "enqueue") -> Any:
        answer = await submit(lanes, thread, text, policy, request_id=request_id)
        assert answer == await lanes.get_request(tenant=TENANT, request_id=request_id)
        return answer

    answers = [
        await submitted("t1", "dispatched", "a"),
        await submitted("t1", "queued first", "b"),
        await submitted("t1", "queued second", "c"),
        await submitted("t1", "steer", "d", policy="steer"),
        await submitted("t1", "rejected", "e", policy="reject"),
        await submitted("t2", "steer on an idle lane", "f", policy="steer"),
    ]
    # t3 left idle with two requests queued, as a crash between statements
    # could leave it: the head, not the new request, is dispatched.
    await submit(lanes, "t3", "old run", request_id="g")
    await submit(lanes, "t3", "old head", request_id="h")
    await submit(lanes, "t3", "old second", request_id="i")
    sql.execute("SET session_replication_role = replica")
    sql.execute(
        "UPDATE runlane.runs SET status = 'completed', finished_at = now()"
        " WHERE input->>'text' = 'old run'"
    )
    sql.execute("SET session_replication_role = origin")
    answers.append(await submitted("t3", "behind the old queue", "j"))

    got = {a.request_id: (a.status, a.position, a.run_id is not None) for a in answers}
    assert got == {
        "a": (RequestStatus.DISPATCHED, None, True),
        "b": (RequestStatus.QUEUED, 1, False),
        "c": (RequestStatus.QUEUED, 2, False),
        "d": (RequestStatus.QUEUED, 1, False),
        "e": (RequestStatus.REJECTED, None, False),
        "f": (RequestStatus.DISPATCHED, None, True),
        "j": (RequestStatus.QUEUED, 2, False),
    }
    head = await lanes.get_request(tenant=TENANT, request_id="h")
    assert head.status is RequestStatus.DISPATCHED and head.run_id is not None


async def test_same_request_id_with_other_input_or_lane_is_a_conflict(
    lanes: LaneService,
) -> None:
    await submit(lanes, "t1", "hi", request_id="r-1")
    await expect_refusal("request_id_conflict", submit(lanes, "t1", "other", request_id="r-1"))
    await expect_refusal("request_id_conflict", submit(lanes, "t2", "hi", request_id="r-1"))


async def test_request_ids_are_per_tenant(lanes: LaneService) -> None:
    await submit(lanes, "t1", "hi", request_id="r-1")
    other, created = await lanes.submit(
        tenant="globex",
        user_id=USER,
        agent=AGENT,
        thread_id="t1",
        input={"text": "hi"},
        request_id="r-1",
    )
    assert created and other.status is RequestStatus.DISPATCHED


# -- positions and cancel -----------------------------------------------------------


async def test_cancelling_a_queued_request_moves_the_rest_up(lanes: LaneService) -> None:
    await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two", request_id="two")
    three = await submit(lanes, "t1", "three", request_id="three")
    assert three.position == 2
    cancelled = await lanes.cancel_request(tenant=TENANT, request_id="two")
    assert cancelled.status is RequestStatus.CANCELLED and cancelled.position is None
    assert (await lanes.get_request(tenant=TENANT, request_id="three")).position == 1
    again = await lanes.cancel_request(tenant=TENANT, request_id="two")
    assert again.status is RequestStatus.CANCELLED


async def test_a_dispatched_request_cannot_be_cancelled(lanes: LaneService) -> None:
    first = await submit(lanes, "t1", "one", request_id="one")
    error = await expect_refusal(
        "request_already_dispatched", lanes.cancel_request(tenant=TENANT, request_id="one")
    )
    assert error.run_id == first.run_id and str(first.run_id) in error.message


async def test_a_rejected_request_cannot_be_cancelled(lanes: LaneService) -> None:
    await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two", policy="reject", request_id="two")
    await expect_refusal(
        "request_not_queued", lanes.cancel_request(tenant=TENANT, request_id="two")
    )


async def test_unknown_request(lanes: LaneService) -> None:
    with pytest.raises(NotFound):
        await lanes.get_request(tenant=TENANT, request_id="nope")
    with pytest.raises(NotFound):
        await lanes.cancel_request(tenant=TENANT, request_id="nope")


# -- pause and continue ---------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [(Outcome.FAILED, "run_failed"), (Outcome.CANCELLED, "run_cancelled")],
)
async def test_a_failed_or_cancelled_run_pauses_a_lane_with_requests_waiting(
    lanes: LaneService, store: RunStore, service: RunService, outcome: Outcome, reason: str
) -> None:
    first = await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two")
    await submit(lanes, "t1", "three")
    assert first.run_id is not None
    await run_to_end(store, first.run_id, outcome)
    snap = await snapshot(lanes, "t1")
    assert (snap.state, snap.paused_reason, snap.run_id) == (
        LaneState.PAUSED,
        reason,
        first.run_id,
    )
    # Waiting requests stay queued; enqueue still queues.
    later = await submit(lanes, "t1", "four")
    assert later.status is RequestStatus.QUEUED and later.position == 3
    # continue dispatches only the head.
    head = await lanes.continue_lane(tenant=TENANT, user_id=USER, agent=AGENT, thread_id="t1")
    assert head.input == {"text": "two"} and head.status is RequestStatus.DISPATCHED
    snap = await snapshot(lanes, "t1")
    assert snap.state is LaneState.RUNNING
    assert await queued_texts(lanes, "t1") == [("three", 1), ("four", 2)]


async def test_dead_run_pauses_the_lane(lanes: LaneService, store: RunStore) -> None:
    first = await submit(lanes, "t1", "one", max_attempts=1)
    await submit(lanes, "t1", "two")
    assert first.run_id is not None
    after = await run_to_end(store, first.run_id, Outcome.RETRY, retry_delay_seconds=0)
    assert after.status is RunStatus.DEAD
    snap = await snapshot(lanes, "t1")
    assert (snap.state, snap.paused_reason) == (LaneState.PAUSED, "run_dead")


async def test_cancelling_a_pending_lane_run_pauses_the_lane(
    lanes: LaneService, service: RunService
) -> None:
    first = await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two")
    assert first.run_id is not None
    await lanes.cancel_run(first.run_id)
    snap = await snapshot(lanes, "t1")
    assert (snap.state, snap.paused_reason) == (LaneState.PAUSED, "run_cancelled")


async def test_a_failed_run_with_nothing_waiting_leaves_the_lane_idle(
    lanes: LaneService, store: RunStore
) -> None:
    first = await submit(lanes, "t1", "one")
    assert first.run_id is not None
    await run_to_end(store, first.run_id, Outcome.FAILED)
    assert (await snapshot(lanes, "t1")).state is LaneState.IDLE
    assert (await submit(lanes, "t1", "two")).status is RequestStatus.DISPATCHED


async def test_continue_refusals(lanes: LaneService, store: RunStore) -> None:
    async def cont() -> Any:
        return await lanes.continue_lane(tenant=TENANT, user_id=USER, agent=AGENT, thread_id="t1")

    await expect_refusal("queue_not_paused", cont())
    first = await submit(lanes, "t1", "one")
    await expect_refusal("run_active", cont())
    await submit(lanes, "t1", "two", request_id="two")
    assert first.run_id is not None
    await run_to_end(store, first.run_id, Outcome.FAILED)
    # Cancelling the last waiting request of a paused lane makes it idle.
    await lanes.cancel_request(tenant=TENANT, request_id="two")
    assert (await snapshot(lanes, "t1")).state is LaneState.IDLE
    await expect_refusal("queue_not_paused", cont())


async def test_continue_refused_on_an_empty_paused_queue(
    lanes: LaneService, store: RunStore, sql: Conn
) -> None:
    first = await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two")
    assert first.run_id is not None
    await run_to_end(store, first.run_id, Outcome.FAILED)
    # Empty the queue behind the lane's back (an operator's direct edit).
    sql.execute("UPDATE runlane.requests SET status = 'failed' WHERE status = 'queued'")
    await expect_refusal(
        "queue_empty",
        lanes.continue_lane(tenant=TENANT, user_id=USER, agent=AGENT, thread_id="t1"),
    )


async def test_requeue_of_a_failed_lane_run_lifts_its_pause(
    lanes: LaneService, store: RunStore, service: RunService
) -> None:
    first = await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two")
    assert first.run_id is not None
    await run_to_end(store, first.run_id, Outcome.FAILED)
    requeued = await service.requeue(first.run_id)
    assert requeued.status is RunStatus.PENDING
    snap = await snapshot(lanes, "t1")
    assert snap.state is LaneState.RUNNING and snap.run_id == first.run_id


async def test_requeue_of_a_lane_run_is_refused_while_another_is_active(
    lanes: LaneService, store: RunStore, service: RunService
) -> None:
    first = await submit(lanes, "t1", "one")
    assert first.run_id is not None
    await run_to_end(store, first.run_id, Outcome.FAILED)
    await submit(lanes, "t1", "two")
    await expect_refusal("run_active", service.requeue(first.run_id))


# -- interrupt and resume ---------------------------------------------------------


async def test_interrupt_keeps_the_queue_and_refuses_new_work(
    lanes: LaneService, store: RunStore, service: RunService, sql: Conn
) -> None:
    first = await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two")
    assert first.run_id is not None
    claimed = await claim(store, first.run_id)
    await store.save_checkpoint(first.run_id, claimed.lease_token, {"turn": 2})
    interrupted = await finish(store, claimed, Outcome.INTERRUPTED, interrupt={"ask": "ok?"})
    assert interrupted.status is RunStatus.INTERRUPTED and interrupted.interrupt == {"ask": "ok?"}
    snap = await snapshot(lanes, "t1")
    assert (snap.state, snap.run_id) == (LaneState.INTERRUPTED, first.run_id)
    assert await queued_texts(lanes, "t1") == [("two", 1)]

    before = sql.execute("SELECT count(*) FROM runlane.requests").fetchone()
    await expect_refusal("run_interrupted", submit(lanes, "t1", "three"))
    await expect_refusal("run_interrupted", submit(lanes, "t1", "s", policy="steer"))
    assert sql.execute("SELECT count(*) FROM runlane.requests").fetchone() == before
    rejected = await submit(lanes, "t1", "four", policy="reject")
    assert (rejected.status, rejected.reason) == (RequestStatus.REJECTED, "run_interrupted")
    await expect_refusal(
        "run_interrupted",
        lanes.continue_lane(tenant=TENANT, user_id=USER, agent=AGENT, thread_id="t1"),
    )

    resume, created = await lanes.resume(first.run_id, {"approved": True})
    assert created and resume.kind == "resume" and resume.resumed_from == first.run_id
    assert resume.resume_value == {"approved": True} and resume.checkpoint == {"turn": 2}
    again, created_again = await lanes.resume(first.run_id, {"approved": True})
    assert not created_again and again.id == resume.id
    await expect_refusal("resume_superseded", lanes.resume(first.run_id, {"approved": False}))
    snap = await snapshot(lanes, "t1")
    assert (snap.state, snap.run_id) == (LaneState.RUNNING, resume.id)
    # The resume is outside the queue; when it completes the queue moves on.
    await run_to_end(store, resume.id, Outcome.COMPLETED, output="done")
    snap = await snapshot(lanes, "t1")
    next_run = await service.get(snap.run_id)  # type: ignore[arg-type]
    assert next_run.input == {"text": "two"}


async def test_only_the_latest_interrupted_run_can_be_resumed(
    lanes: LaneService, store: RunStore
) -> None:
    first = await submit(lanes, "t1", "one")
    assert first.run_id is not None
    await run_to_end(store, first.run_id, Outcome.INTERRUPTED, interrupt={"q": 1})
    resume, _ = await lanes.resume(first.run_id, "yes")
    await run_to_end(store, resume.id, Outcome.INTERRUPTED, interrupt={"q": 2})
    await expect_refusal("resume_superseded", lanes.resume(first.run_id, "no"))
    _, created = await lanes.resume(resume.id, "sure")
    assert created


async def test_resume_of_a_run_that_is_not_interrupted(lanes: LaneService, store: RunStore) -> None:
    first = await submit(lanes, "t1", "one")
    assert first.run_id is not None
    await expect_refusal("not_interrupted", lanes.resume(first.run_id, 1))


async def test_cancelling_an_interrupted_run_pauses_the_lane(
    lanes: LaneService, store: RunStore, service: RunService
) -> None:
    first = await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two")
    assert first.run_id is not None
    await run_to_end(store, first.run_id, Outcome.INTERRUPTED, interrupt={})
    cancelled = await lanes.cancel_run(first.run_id)
    assert cancelled.status is RunStatus.CANCELLED
    snap = await snapshot(lanes, "t1")
    assert (snap.state, snap.paused_reason) == (LaneState.PAUSED, "run_cancelled")
    await expect_refusal("not_interrupted", lanes.resume(first.run_id, 1))


async def test_an_unanswered_interrupt_expires_cancelled(
    lanes: LaneService, store: RunStore, service: RunService, sql: Conn
) -> None:
    first = await submit(lanes, "t1", "one")
    assert first.run_id is not None
    await run_to_end(
        store, first.run_id, Outcome.INTERRUPTED, interrupt={}, interrupt_expires_in=60
    )
    assert await lanes.lanes.recover() == RecoveryResult(dispatched=0, interrupts_expired=0)
    sql.execute("UPDATE runlane.runs SET interrupt_expires_at = now() - interval '1 second'")
    assert await lanes.lanes.recover() == RecoveryResult(dispatched=0, interrupts_expired=1)
    run = await service.get(first.run_id)
    assert run.status is RunStatus.CANCELLED and run.error["code"] == "interrupt_expired"
    assert (await snapshot(lanes, "t1")).state is LaneState.IDLE


# -- recovery -----------------------------------------------------------------------


async def test_recovery_dispatches_idle_lanes_with_queued_requests(
    lanes: LaneService, sql: Conn, service: RunService
) -> None:
    await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two")
    await submit(lanes, "t2", "other")
    # Leave t1 idle with a queue, as a crash between statements could.
    sql.execute("SET session_replication_role = replica")
    sql.execute(
        "UPDATE runlane.runs SET status = 'completed', finished_at = now()"
        " WHERE input->>'text' = 'one'"
    )
    sql.execute("SET session_replication_role = origin")
    assert await lanes.lanes.recover() == RecoveryResult(dispatched=1, interrupts_expired=0)
    snap = await snapshot(lanes, "t1")
    run = await service.get(snap.run_id)  # type: ignore[arg-type]
    assert run.input == {"text": "two"}
    assert await lanes.lanes.recover() == RecoveryResult(dispatched=0, interrupts_expired=0)


async def test_one_recovery_pass_at_a_time(lanes: LaneService, db_url: str) -> None:
    with psycopg.connect(db_url) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s)", (RECOVERY_LOCK_KEY,))
        assert await lanes.lanes.recover() is None


async def test_recovery_reads_only_lanes_with_queued_requests(
    lanes: LaneService, sql: Conn
) -> None:
    """The recovery query walks the partial index of queued requests: its
    cost grows with the lanes that need work, not with all lanes ever used
    (20,000 lanes and requests here)."""
    sql.execute(
        "INSERT INTO runlane.lanes (tenant, user_id, agent, thread_id)"
        " SELECT 'acme', 'ann', 'bot', 'old-' || i FROM generate_series(1, 20000) AS i"
    )
    sql.execute(
        "INSERT INTO runlane.requests (request_id, tenant, lane_id, policy, status, input,"
        " max_attempts, request_order, ended_at)"
        " SELECT 'r-' || id, 'acme', id, 'enqueue', 'cancelled', '{}', 3, 1, now()"
        " FROM runlane.lanes"
    )
    await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two")
    sql.execute("ANALYZE runlane.requests")
    sql.execute("ANALYZE runlane.lanes")
    sql.execute("ANALYZE runlane.runs")
    query = named_queries("lanes.sql")["lanes_needing_dispatch"]
    read = (
        "SELECT sum(seq_tup_read + coalesce(idx_tup_fetch, 0)) FROM pg_stat_xact_user_tables"
        " WHERE schemaname = 'runlane' AND relname IN ('lanes', 'requests', 'runs')"
    )
    with sql.transaction(force_rollback=True):
        before = sql.execute(read).fetchone()
        found = sql.execute(query, {"limit": 500}).fetchall()
        after = sql.execute(read).fetchone()
    assert found == []  # t1's second request waits for its first run
    assert before is not None and after is not None
    assert after[0] - before[0] < 100


async def test_an_answered_interrupt_neither_expires_nor_can_be_cancelled(
    lanes: LaneService, store: RunStore, service: RunService, sql: Conn
) -> None:
    first = await submit(lanes, "t1", "one")
    await submit(lanes, "t1", "two")
    assert first.run_id is not None
    await run_to_end(
        store, first.run_id, Outcome.INTERRUPTED, interrupt={}, interrupt_expires_in=60
    )
    resume, _ = await lanes.resume(first.run_id, "yes")
    sql.execute(
        "UPDATE runlane.runs SET interrupt_expires_at = now() - interval '1 second'"
        " WHERE id = %s AND interrupt_expires_at IS NOT NULL",
        (first.run_id,),
    )
    assert await lanes.lanes.recover() == RecoveryResult(dispatched=0, interrupts_expired=0)
    with pytest.raises(RunFinished):
        await lanes.cancel_run(first.run_id)
    snap = await snapshot(lanes, "t1")
    assert (snap.state, snap.run_id) == (LaneState.RUNNING, resume.id)


async def test_a_steer_waits_for_a_resume_instead_of_discarding_its_answer(
    lanes: LaneService, store: RunStore, service: RunService
) -> None:
    first = await submit(lanes, "t1", "one")
    assert first.run_id is not None
    await run_to_end(store, first.run_id, Outcome.INTERRUPTED, interrupt={})
    resume, _ = await lanes.resume(first.run_id, "the answer")
    steer = await submit(lanes, "t1", "steer", policy="steer", request_id="s")
    assert steer.status is RequestStatus.QUEUED
    still = await service.get(resume.id)
    assert still.status is RunStatus.PENDING and still.steer_requested_at is None
    # Nobody was asked to yield to it, so it can still be cancelled.
    cancelled = await lanes.cancel_request(tenant=TENANT, request_id="s")
    assert cancelled.status is RequestStatus.CANCELLED


async def test_requeue_of_an_older_run_does_not_bypass_a_pause(
    lanes: LaneService, store: RunStore, service: RunService
) -> None:
    first = await submit(lanes, "t1", "one")
    assert first.run_id is not None
    await run_to_end(store, first.run_id, Outcome.FAILED)
    second = await submit(lanes, "t1", "two")
    await submit(lanes, "t1", "three")
    assert second.run_id is not None
    await run_to_end(store, second.run_id, Outcome.FAILED)
    assert (await snapshot(lanes, "t1")).state is LaneState.PAUSED
    await expect_refusal("lane_paused", service.requeue(first.run_id))
