"""Queue operations against a real PostgreSQL: submit, claim, renew, finish,
cancel, reap, re-queue; every fenced write refused for a stale token."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from runlane.errors import InvalidInput, NotFound, NotRetryable, PayloadTooLarge, RunFinished
from runlane.lane_service import LaneService
from runlane.models import ClaimedRun, LeaseState, Outcome, RunStatus
from runlane.queries import named_queries
from runlane.reaper import Reaper
from runlane.service import RunService
from runlane.store import (
    REAPER_LOCK_KEY,
    ClaimSpec,
    Finish,
    RunCursor,
    RunStore,
    WorkerIdentity,
)
from tests.support import claimed_as_stored, run_status, wait_until

Conn = psycopg.Connection[Any]


async def claim_one(
    store: RunStore, *, lease_seconds: float = 30, worker: str = "w1"
) -> ClaimedRun:
    batch = await store.claim_batch(worker_id=worker, limit=1, lease_seconds=lease_seconds)
    assert len(batch) == 1, "expected a run to claim"
    return batch[0]


async def expire_and_reap(store: RunStore, sql: Conn, run_id: uuid.UUID) -> None:
    """Waits (by the database clock) for the run's lease to expire, then reaps."""
    await wait_until(
        lambda: sql.execute(
            "SELECT lease_expires_at < now() FROM runlane.runs WHERE id = %s", (run_id,)
        ).fetchone()[0],  # type: ignore[index]
        message="lease expiry",
    )
    await Reaper(store, interval_seconds=1).sweep()


# -- submit -------------------------------------------------------------------


async def test_submit_stores_a_pending_run(service: RunService, sql: Conn) -> None:
    run, created = await service.submit(
        "support-bot", {"q": "hi"}, priority=5, max_attempts=4, budget={"max_seconds": 60}
    )
    assert created
    row = sql.execute(
        "SELECT status, agent, input, priority, max_attempts, budget, attempts"
        " FROM runlane.runs WHERE id = %s",
        (run.id,),
    ).fetchone()
    assert row == ("pending", "support-bot", {"q": "hi"}, 5, 4, {"max_seconds": 60}, 0)


async def test_json_values_come_back_as_submitted(service: RunService, store: RunStore) -> None:
    # Read through the pool's own jsonb loader (runlane.database): strings
    # beyond ASCII, numbers beyond 64 bits, nesting; and the empty object,
    # which it builds without parsing, must still be a new dict per value.
    value = {
        "text": "caf\u00e9 \u2014 \U0001f600",
        "big": 123456789012345678901234567890,
        "float": 1.5,
        "list": [None, True, {}, [], ""],
        "nested": {"a": {"b": {"c": "d"}}},
    }
    first, _ = await service.submit("a", value)
    second, _ = await service.submit("a", {})
    claimed = {c.id: c for c in await store.claim_batch(worker_id="w", limit=2, lease_seconds=30)}
    assert claimed[first.id].input == value
    assert claimed[second.id].input == {}
    runs = [claimed[first.id], claimed[second.id]]
    assert [r.metadata for r in runs] == [{}, {}] and [r.budget for r in runs] == [{}, {}]
    runs[0].metadata["changed"] = True
    assert runs[1].metadata == {} and runs[0].budget == {} and runs[1].input == {}


async def test_input_and_metadata_are_stored_from_the_text_their_check_made(
    service: RunService, lanes: LaneService, sql: Conn
) -> None:
    # A submit sends the JSON text its size check made (not psycopg's own,
    # which escapes every non-ASCII character): what is stored must be the
    # value given, in each insert (plain, with a key, a lane's request).
    value = {
        "text": 'caf\u00e9 \U0001f600 "quoted" back\\slash \\u0000 not a NUL \u2028',
        "big": 123456789012345678901234567890,
        "float": -0.5e-7,
        "list": [None, True, {}, [], ""],
    }
    metadata = {"trace": "\u00fcber", "n": 1}
    plain, _ = await service.submit("a", value, metadata=metadata)
    keyed, _ = await service.submit("a", value, metadata=metadata, idempotency_key="k")
    request, _ = await lanes.submit(
        tenant="t", user_id="u", agent="a", thread_id="th", input=value, metadata=metadata
    )
    assert request.run_id is not None
    for run_id in (plain.id, keyed.id, request.run_id):
        row = sql.execute(
            "SELECT input, metadata FROM runlane.runs WHERE id = %s", (run_id,)
        ).fetchone()
        assert row == (value, metadata)
    queued = sql.execute("SELECT input, metadata FROM runlane.requests").fetchall()
    assert queued == [(value, metadata)]


async def test_same_idempotency_key_returns_the_existing_run(service: RunService) -> None:
    first, created1 = await service.submit("a", {"n": 1}, idempotency_key="k-1")
    second, created2 = await service.submit("a", {"n": 2}, idempotency_key="k-1")
    other_tenant, created3 = await service.submit(
        "a", {"n": 3}, idempotency_key="k-1", tenant="other"
    )
    assert created1 and not created2 and created3
    assert second.id == first.id and second.input == {"n": 1}
    assert other_tenant.id != first.id


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"agent": ""}, InvalidInput),
        ({"agent": "has space"}, InvalidInput),
        ({"input": {"blob": "x" * 5000}}, PayloadTooLarge),
        ({"input": {"bad": {1, 2}}}, InvalidInput),
        ({"input": float("nan")}, InvalidInput),
        ({"priority": 10_000}, InvalidInput),
        ({"delay_seconds": -1}, InvalidInput),
        ({"max_attempts": 0}, InvalidInput),
        ({"budget": {"max_seconds": 0}}, InvalidInput),
        ({"budget": {"max_turns": 1.5}}, InvalidInput),
        ({"budget": {"tokens": 5}}, InvalidInput),
        ({"idempotency_key": ""}, InvalidInput),
    ],
)
async def test_bad_submissions_are_refused_and_store_nothing(
    service: RunService, sql: Conn, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    service.settings = service.settings.model_copy(update={"max_input_bytes": 4096})
    args: dict[str, Any] = {"agent": "a", "input": {}} | kwargs
    with pytest.raises(error):
        await service.submit(args.pop("agent"), args.pop("input"), **args)
    assert sql.execute("SELECT count(*) FROM runlane.runs").fetchone() == (0,)


async def test_delayed_run_is_not_claimed_before_its_time(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    run, _ = await service.submit("a", {}, delay_seconds=30)
    delay = sql.execute(
        "SELECT extract(epoch FROM available_at - created_at) FROM runlane.runs WHERE id = %s",
        (run.id,),
    ).fetchone()
    assert delay is not None and 29.9 < float(delay[0]) <= 30.1
    assert await store.claim_batch(worker_id="w", limit=10, lease_seconds=30) == []


# -- claim ----------------------------------------------------------------------


async def test_claim_order_is_priority_then_available_at_then_submission(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    low1, _ = await service.submit("a", {"n": "low1"})
    high, _ = await service.submit("a", {"n": "high"}, priority=10)
    low2, _ = await service.submit("a", {"n": "low2"})
    earlier, _ = await service.submit("a", {"n": "earlier"})
    # Same priority, but available earlier than low1 and low2.
    sql.execute(
        "UPDATE runlane.runs SET available_at = available_at - interval '1 minute' WHERE id = %s",
        (earlier.id,),
    )
    batch = await store.claim_batch(worker_id="w", limit=10, lease_seconds=30)
    assert [c.id for c in batch] == [high.id, earlier.id, low1.id, low2.id]


@pytest.mark.parametrize("agents", [None, ["a"]], ids=["any-agent", "agent-list"])
async def test_a_claim_locks_only_what_it_takes_while_no_run_has_aged(
    sql: Conn, db_url: str, agents: list[str] | None
) -> None:
    # With aging on, a claim also reads and locks the oldest runs, which
    # aging may rank first. While none has waited the aging interval none
    # can be (migration 0034): the claim locks only the runs it takes, and
    # other workers' claims meanwhile skip nothing else.
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, priority, created_at)"
        " SELECT 'a', '{}', 3, g % 3, clock_timestamp() FROM generate_series(1, 30) AS g"
    )
    claim = named_queries("queries.sql")["claim_batch"]
    spec = ClaimSpec(worker_id="w", limit=5, lease_seconds=30.0, agents=agents)
    lockable = "SELECT count(*) FROM (SELECT FROM runlane.runs FOR UPDATE SKIP LOCKED) AS free"
    for aged, free in ((False, 25), (True, 22)):
        if aged:
            # Every run has now waited 100 s: both lists are read and
            # locked, the first five by priority and the five oldest.
            sql.execute("UPDATE runlane.runs SET available_at = now() - interval '100 seconds'")
        with psycopg.connect(db_url) as claimer:
            claimed = claimer.execute(claim, {**spec.params(), "aging_seconds": 10.0}).fetchall()
            assert len(claimed) == 5
            # The candidates of the other list stay locked until the
            # claim commits (two runs are in both lists here).
            assert sql.execute(lockable).fetchone() == (free,)
            claimer.rollback()


@pytest.mark.parametrize("agents", [None, ["a", "b"]], ids=["any-agent", "agent-list"])
@pytest.mark.parametrize("caps", [False, True], ids=["no-caps", "a-cap-elsewhere"])
async def test_claims_age_and_order_the_same_with_and_without_caps(
    service: RunService, store: RunStore, sql: Conn, agents: list[str] | None, caps: bool
) -> None:
    # With no cap anywhere the claim takes runlane.claim_uncapped_runs, with
    # one it takes runlane.claim_capped_runs: the same runs come out, in the
    # same order, either way.
    if caps:
        await store.set_tenant_limit("elsewhere", 5)
    fresh_low, _ = await service.submit("a", {"n": "fresh low"})
    high, _ = await service.submit("b", {"n": "high"}, priority=5)
    old_low, _ = await service.submit("a", {"n": "old low"})
    later, _ = await service.submit("b", {"n": "later"}, delay_seconds=30)
    # Waiting 100 s at one point per 10 s lifts "old low" to 10, above 5.
    sql.execute(
        "UPDATE runlane.runs SET available_at = now() - interval '100 seconds' WHERE id = %s",
        (old_low.id,),
    )
    names = {old_low.id: "old low", high.id: "high", fresh_low.id: "fresh low", later.id: "later"}
    claimed = []
    for limit in (1, 1, 10):
        claimed.append(
            await store.claim_batch(
                worker_id="w", limit=limit, lease_seconds=30, agents=agents, aging_seconds=10
            )
        )
    assert [[names[c.id] for c in batch] for batch in claimed] == [
        ["old low"],
        ["high"],
        ["fresh low"],
    ]
    assert all(c.attempts == 1 for batch in claimed for c in batch)
    attempts = [await store.list_attempts(run.id) for run in (old_low, high, fresh_low, later)]
    assert [len(each) for each in attempts] == [1, 1, 1, 0]
    # Without aging, priority alone decides.
    sql.execute("UPDATE runlane.runs SET status = 'pending', lease_token = NULL, attempts = 0")
    by_priority = [
        await store.claim_batch(
            worker_id="w", limit=1, lease_seconds=30, agents=agents, aging_seconds=0
        )
        for _ in range(3)
    ]
    assert [[names[c.id] for c in batch] for batch in by_priority] == [
        ["high"],
        ["old low"],
        ["fresh low"],
    ]


async def test_claim_counts_an_attempt_that_its_end_records(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    run, _ = await service.submit("a", {})
    claimed = await claim_one(store, worker="worker-7")
    assert claimed.attempts == 1 and run_status(sql, run.id) == RunStatus.RUNNING
    assert await store.claim_batch(worker_id="w2", limit=10, lease_seconds=30) == []
    # The attempt in progress is read from the run (migration 0035)...
    (current,) = await store.list_attempts(run.id)
    assert (current.attempt, current.worker_id, current.lease_token, current.ended_at) == (
        1,
        "worker-7",
        claimed.lease_token,
        None,
    )
    assert current.outcome is None and current.started_at is not None
    assert sql.execute(
        "SELECT count(*) FROM runlane.run_attempts WHERE run_id = %s", (run.id,)
    ).fetchone() == (0,)
    lease_left = sql.execute(
        "SELECT extract(epoch FROM lease_expires_at - now()) FROM runlane.runs WHERE id = %s",
        (run.id,),
    ).fetchone()
    assert lease_left is not None and 25 < float(lease_left[0]) <= 30
    # ...and so is the ended attempt, when it was the run's last (migration
    # 0050), with the same start.
    await store.finish_attempt(run.id, claimed.lease_token, Outcome.COMPLETED)
    assert sql.execute(
        "SELECT count(*) FROM runlane.run_attempts WHERE run_id = %s", (run.id,)
    ).fetchone() == (0,)
    (ended,) = await store.list_attempts(run.id)
    assert (ended.attempt, ended.worker_id, ended.lease_token, ended.started_at) == (
        1,
        "worker-7",
        claimed.lease_token,
        current.started_at,
    )
    assert ended.outcome == "completed" and ended.ended_at is not None
    assert ended.ended_at >= ended.started_at


async def test_a_claimed_run_reads_as_the_stored_run(service: RunService, store: RunStore) -> None:
    # A claim answers the columns a worker reads, by position (the worker's
    # hot path); a read answers the whole run by column name: each claimed
    # field must be the stored one, with the same type, whether claimed
    # alone or along with a batch of outcomes.
    first, _ = await service.submit(
        "a",
        {"q": 1},
        priority=3,
        max_attempts=4,
        budget={"max_seconds": 60},
        metadata={"team": "x"},
        idempotency_key="k1",
    )
    second, _ = await service.submit("a", {"q": 2})
    (claimed,) = await store.claim_batch(worker_id="w", limit=1, lease_seconds=30)
    assert claimed.id == first.id
    stored = await store.get_run(first.id)
    assert claimed_as_stored(claimed, stored) == {}
    assert stored is not None and stored.status is RunStatus.RUNNING
    assert claimed.metadata == {"team": "x"} and claimed.budget == {"max_seconds": 60}
    assert claimed.max_attempts == 4 and claimed.attempts == 1 and claimed.kind == "direct"
    assert claimed.lease_token == stored.lease_token is not None
    assert claimed.deadline_in_seconds is not None and 50 < claimed.deadline_in_seconds <= 60

    finish = Finish(first.id, claimed.lease_token, Outcome.COMPLETED, output={"ok": True})
    spec = ClaimSpec(worker_id="w", limit=5, lease_seconds=30)
    statuses, along = await store.finish_attempts_and_claim([finish], spec)
    assert statuses == {first.id: RunStatus.COMPLETED}
    assert [c.id for c in along] == [second.id]
    stored = await store.get_run(second.id)
    assert claimed_as_stored(along[0], stored) == {}
    # No budget given: the deadline is the run's stored one, seen from now.
    assert stored is not None
    deadline_at = stored.deadline_at
    assert deadline_at is not None and along[0].deadline_in_seconds is not None
    left = (deadline_at - datetime.now(UTC)).total_seconds()
    assert abs(along[0].deadline_in_seconds - left) < 5


async def test_a_runs_attempts_read_the_same_wherever_each_is_kept(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    # Migrations 0050 and 0051: a retried attempt gets its row at once, the
    # last one stays on the run, and a re-queue moves it to its row before
    # the next claim. The attempts a run shows, in order and whole, are the same
    # through all of it, and each is stored once.
    run, _ = await service.submit("a", {}, max_attempts=2)

    def stored() -> tuple[int, int]:
        row = sql.execute(
            "SELECT (SELECT count(*) FROM runlane.run_attempts WHERE run_id = %(id)s),"
            " (SELECT count(*) FROM runlane.runs WHERE id = %(id)s"
            "  AND attempt_outcome IS NOT NULL)",
            {"id": run.id},
        ).fetchone()
        assert row is not None
        return row[0], row[1]

    first = await claim_one(store, worker="w1")
    await store.finish_attempt(
        run.id, first.lease_token, Outcome.RETRY, error={"code": "e1"}, retry_delay_seconds=0
    )
    assert stored() == (1, 0)
    second = await claim_one(store, worker="w2")
    await store.finish_attempt(run.id, second.lease_token, Outcome.FAILED, error={"code": "e2"})
    assert stored() == (1, 1)
    before_requeue = await store.list_attempts(run.id)
    assert [
        (a.attempt, a.worker_id, a.lease_token, a.outcome, a.error) for a in before_requeue
    ] == [
        (1, "w1", first.lease_token, "retry", {"code": "e1"}),
        (2, "w2", second.lease_token, "failed", {"code": "e2"}),
    ]
    assert all(a.ended_at is not None and a.ended_at >= a.started_at for a in before_requeue)
    requeued, done = await store.requeue_run(run.id)
    assert done and requeued is not None and requeued.status == RunStatus.PENDING
    assert stored() == (2, 0)
    assert await store.list_attempts(run.id) == before_requeue
    third = await claim_one(store, worker="w3")
    assert (await store.list_attempts(run.id))[:2] == before_requeue
    await store.finish_attempt(run.id, third.lease_token, Outcome.COMPLETED, output={"ok": 1})
    assert stored() == (2, 1)
    attempts = await store.list_attempts(run.id)
    assert attempts[:2] == before_requeue
    assert [(a.attempt, a.worker_id, a.lease_token, a.outcome) for a in attempts[2:]] == [
        (3, "w3", third.lease_token, "completed")
    ]


async def test_a_requeue_by_an_older_process_moves_the_kept_attempt_too(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    # A re-queue written as processes before migration 0050 write it (no
    # word of the kept attempt) moves the attempt kept on the run to its
    # row all the same (0051), before the next claim can overwrite its
    # number and start: nothing is lost.
    run, _ = await service.submit("a", {}, max_attempts=1)
    first = await claim_one(store, worker="w1")
    await store.finish_attempt(run.id, first.lease_token, Outcome.FAILED, error={"code": "e1"})
    (kept,) = await store.list_attempts(run.id)
    sql.execute(
        "UPDATE runlane.runs SET status = 'pending', attempts = 0, available_at = now(),"
        " finished_at = NULL, error = NULL, output = NULL, outcome = NULL, deadline_at = NULL,"
        " cancel_requested_at = NULL, steer_requested_at = NULL WHERE id = %s",
        (run.id,),
    )
    assert sql.execute(
        "SELECT attempt_outcome FROM runlane.runs WHERE id = %s", (run.id,)
    ).fetchone() == (None,)
    assert await store.list_attempts(run.id) == [kept]
    second = await claim_one(store, worker="w2")
    await store.finish_attempt(run.id, second.lease_token, Outcome.COMPLETED)
    after = await store.list_attempts(run.id)
    assert after[0] == kept
    assert [(a.attempt, a.worker_id, a.lease_token, a.outcome) for a in after[1:]] == [
        (2, "w2", second.lease_token, "completed")
    ]


async def test_attempt_rows_go_with_their_runs(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    # run_attempts has no foreign key to runs (migration 0027): a statement
    # that deletes runs, whoever sends it, deletes their attempts too, and
    # only theirs.
    gone, _ = await service.submit("a", {})
    also_gone, _ = await service.submit("a", {})
    kept, _ = await service.submit("a", {})
    for _ in range(3):
        # A failed attempt stays on its run until a re-queue moves it to
        # run_attempts (migration 0050).
        claimed = await claim_one(store)
        await store.finish_attempt(claimed.id, claimed.lease_token, Outcome.FAILED)
        await store.requeue_run(claimed.id)
    assert len(sql.execute("SELECT run_id FROM runlane.run_attempts").fetchall()) == 3
    sql.execute("DELETE FROM runlane.runs WHERE id = ANY(%s)", ([gone.id, also_gone.id],))
    left = sql.execute("SELECT run_id FROM runlane.run_attempts").fetchall()
    assert left == [(kept.id,)]


async def test_a_run_takes_only_known_statuses_and_kinds(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    # A run's status and kind are checked by the domains runlane.run_status
    # and runlane.run_kind (migration 0032), by whichever statement writes
    # them: an INSERT, an operator's UPDATE. A refused write leaves the run
    # as it was; the lease check still ties a leased status to a lease
    # token, and the finished check (0052) a final status to finished_at,
    # which the lane's relay and the streams' notification fire on.
    run, _ = await service.submit("a", {})
    with pytest.raises(psycopg.errors.CheckViolation, match="run_status_check"):
        sql.execute("UPDATE runlane.runs SET status = 'paused' WHERE id = %s", (run.id,))
    with pytest.raises(psycopg.errors.CheckViolation, match="run_kind_check"):
        sql.execute("UPDATE runlane.runs SET kind = 'batch' WHERE id = %s", (run.id,))
    with pytest.raises(psycopg.errors.CheckViolation, match="run_status_check"):
        sql.execute(
            "INSERT INTO runlane.runs (agent, input, max_attempts, status)"
            " VALUES ('a', '{}', 3, 'Pending')"
        )
    with pytest.raises(psycopg.errors.CheckViolation, match="run_kind_check"):
        sql.execute(
            "INSERT INTO runlane.runs (agent, input, max_attempts, kind)"
            " VALUES ('a', '{}', 3, 'Direct')"
        )
    with pytest.raises(psycopg.errors.CheckViolation, match="runs_lease_check"):
        sql.execute(
            "UPDATE runlane.runs SET lease_token = gen_random_uuid() WHERE id = %s", (run.id,)
        )
    with pytest.raises(psycopg.errors.CheckViolation, match="runs_finished_check"):
        sql.execute("UPDATE runlane.runs SET status = 'cancelled' WHERE id = %s", (run.id,))
    with pytest.raises(psycopg.errors.CheckViolation, match="runs_finished_check"):
        sql.execute("UPDATE runlane.runs SET finished_at = now() WHERE id = %s", (run.id,))
    assert (await store.get_run(run.id)) == run
    row = sql.execute("SELECT count(*) FROM runlane.runs").fetchone()
    assert row == (1,)
    claimed = await claim_one(store)
    assert claimed.id == run.id and run_status(sql, run.id) == RunStatus.RUNNING


async def test_every_final_status_is_notified_to_the_streams(
    service: RunService, store: RunStore, sql: Conn, db_url: str
) -> None:
    # The API's streams wake on NOTIFY runlane_run_changes. The outcome
    # write sends it for the runs it ends (migration 0028); any other
    # UPDATE to a final status gets it from runs_notify_status, also on a
    # connection that has just written outcomes (the function's setting
    # that silences the trigger ends with its call).
    with psycopg.connect(db_url, autocommit=True) as listening:
        listening.execute("LISTEN runlane_run_changes")
        completed, _ = await service.submit("a", {})
        cancelled, _ = await service.submit("a", {}, delay_seconds=3600)
        retried, _ = await service.submit("a", {})
        first, second = (await store.claim_batch(worker_id="w", limit=2, lease_seconds=30))[:2]
        outcomes = {completed.id: "completed", retried.id: "retry"}
        rows = sql.execute(
            "SELECT run_id, run_status FROM runlane.finish_attempts(%s, %s, %s,"
            " ARRAY[NULL, NULL]::jsonb[], ARRAY[NULL, NULL]::jsonb[],"
            " ARRAY[NULL, NULL]::float8[], ARRAY[NULL, NULL]::jsonb[],"
            " ARRAY[NULL, NULL]::float8[], false)",
            (
                [first.id, second.id],
                [first.lease_token, second.lease_token],
                [outcomes[first.id], outcomes[second.id]],
            ),
        ).fetchall()
        assert dict(rows) == {completed.id: "completed", retried.id: "pending"}
        sql.execute(
            "UPDATE runlane.runs SET status = 'cancelled', finished_at = now() WHERE id = %s",
            (cancelled.id,),
        )
        # In commit order: the outcome write's, then the cancel's. The run
        # that went back to pending reached no final status: not notified.
        heard = [n.payload for n in listening.notifies(timeout=5.0, stop_after=2)]
        assert heard == [str(completed.id), str(cancelled.id)]


async def test_an_outcome_batch_names_the_runs_it_ended_in_one_notification_per_200(
    service: RunService, store: RunStore, sql: Conn, db_url: str
) -> None:
    # A worker's batch of outcomes notifies the streams once per 200 ended
    # runs (migration 0047), each payload under NOTIFY's 8,000 bytes; a run
    # that goes back to pending is not named.
    for _ in range(202):
        await service.submit("a", {})
    claimed = await store.claim_batch(worker_id="w", limit=202, lease_seconds=30)
    assert len(claimed) == 202
    retried = claimed[0].id
    with psycopg.connect(db_url, autocommit=True) as listening:
        listening.execute("LISTEN runlane_run_changes")
        sql.execute(
            "SELECT count(*) FROM runlane.finish_attempts(%s, %s, %s,"
            " NULL::jsonb[], NULL::jsonb[], NULL::float8[], NULL::jsonb[], NULL::float8[],"
            " false)",
            (
                [c.id for c in claimed],
                [c.lease_token for c in claimed],
                ["retry" if c.id == retried else "completed" for c in claimed],
            ),
        )
        heard = [n.payload for n in listening.notifies(timeout=5.0, stop_after=2)]
        assert len(heard) == 2
        assert all(len(p.split(",")) <= 200 and len(p.encode()) < 8000 for p in heard)
        named = [uuid.UUID(i) for p in heard for i in p.split(",")]
        assert sorted(named) == sorted(c.id for c in claimed if c.id != retried)
        # Nothing more comes for this batch.
        assert list(listening.notifies(timeout=0.5)) == []


async def test_claim_can_be_limited_to_some_agents(service: RunService, store: RunStore) -> None:
    await service.submit("mail", {})
    wanted, _ = await service.submit("chat", {})
    batch = await store.claim_batch(worker_id="w", limit=10, lease_seconds=30, agents=["chat"])
    assert [c.id for c in batch] == [wanted.id]


# -- heartbeat ------------------------------------------------------------------


async def test_renew_leases_renews_all_in_one_call_and_reports_lost_and_cancelled(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    for _ in range(3):
        await service.submit("a", {})
    c1, c2, c3 = await store.claim_batch(worker_id="w", limit=3, lease_seconds=5)
    await service.cancel(c2.id)
    stale = uuid.uuid4()
    held = await store.renew_leases(
        [(c1.id, c1.lease_token), (c2.id, c2.lease_token), (c3.id, stale)],
        lease_seconds=60,
    )
    assert held == {
        c1.id: LeaseState(RunStatus.RUNNING, steer_requested=False),
        c2.id: LeaseState(RunStatus.CANCEL_REQUESTED, steer_requested=False),
    }
    left = dict(
        sql.execute(  # type: ignore[arg-type]
            "SELECT id, extract(epoch FROM lease_expires_at - now())::float FROM runlane.runs"
        ).fetchall()
    )
    assert left[c1.id] > 55 and left[c2.id] > 55
    assert left[c3.id] <= 5  # the stale token renewed nothing


async def test_a_worker_holding_no_lease_still_shows_up_alive(store: RunStore, sql: Conn) -> None:
    # An idle worker's tick sends empty id and token arrays (binary
    # placeholders, with no element to take a type from); the statement
    # must still record the worker, running nothing.
    worker = WorkerIdentity(id="idle-1", hostname="h", pid=7, agents=["a"], concurrency=4)
    assert await store.renew_leases([], lease_seconds=30, worker=worker) == {}
    row = sql.execute(
        "SELECT running, concurrency, last_seen_at > now() - interval '1 minute'"
        " FROM runlane.workers WHERE id = 'idle-1'"
    ).fetchone()
    assert row == (0, 4, True)


async def test_an_expired_lease_is_not_revived_by_a_late_heartbeat(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    run, _ = await service.submit("a", {})
    claimed = await claim_one(store, lease_seconds=0.2)
    await wait_until(
        lambda: sql.execute("SELECT lease_expires_at < now() FROM runlane.runs").fetchone()[0],  # type: ignore[index]
        message="lease expiry",
    )
    assert await store.renew_leases([(run.id, claimed.lease_token)], lease_seconds=30) == {}


# -- fencing --------------------------------------------------------------------


async def test_every_fenced_write_is_refused_for_a_stale_token(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    run, _ = await service.submit("a", {}, max_attempts=3)
    old = await claim_one(store, lease_seconds=0.2)
    assert await store.append_event(run.id, old.lease_token, "token", {"t": "old-1"}) == 1
    await expire_and_reap(store, sql, run.id)
    sql.execute("UPDATE runlane.runs SET available_at = now() WHERE id = %s", (run.id,))
    new = await claim_one(store, worker="w2")
    assert new.attempts == 2 and new.lease_token != old.lease_token
    await store.save_checkpoint(run.id, new.lease_token, {"turn": 1})

    # The stale owner tries every kind of write: none changes anything.
    assert await store.append_event(run.id, old.lease_token, "token", {"t": "old-2"}) is None
    assert await store.save_checkpoint(run.id, old.lease_token, {"turn": 99}) is False
    assert await store.record_effect(run.id, old.lease_token, "mail", "sent") == (False, None)
    assert await store.renew_leases([(run.id, old.lease_token)], lease_seconds=30) == {}
    assert await store.finish_attempt(run.id, old.lease_token, Outcome.COMPLETED, output=1) is None
    assert await store.finish_attempt(run.id, old.lease_token, Outcome.FAILED) is None

    row = sql.execute(
        "SELECT status, lease_token, checkpoint, output, last_event_seq FROM runlane.runs"
        " WHERE id = %s",
        (run.id,),
    ).fetchone()
    assert row == ("running", new.lease_token, {"turn": 1}, None, 1)
    assert sql.execute("SELECT count(*) FROM runlane.run_effects").fetchone() == (0,)
    # The new owner's writes still go through.
    assert await store.append_event(run.id, new.lease_token, "token", {"t": "new"}) == 2
    done = await store.finish_attempt(run.id, new.lease_token, Outcome.COMPLETED, output="ok")
    assert done is not None and done.status is RunStatus.COMPLETED


# -- finishing --------------------------------------------------------------------


async def test_retry_waits_the_backoff_by_the_database_clock(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    run, _ = await service.submit("a", {}, max_attempts=5)
    waits = []
    for _ in range(3):
        claimed = await claim_one(store)
        after = await store.finish_attempt(
            run.id, claimed.lease_token, Outcome.RETRY, error={"code": "exception"}
        )
        assert after is not None and after.status is RunStatus.PENDING
        wait = sql.execute(
            "SELECT extract(epoch FROM r.available_at - a.ended_at)::float"
            " FROM runlane.runs r JOIN runlane.run_attempts a ON a.run_id = r.id"
            " WHERE r.id = %s ORDER BY a.attempt DESC LIMIT 1",
            (run.id,),
        ).fetchone()
        assert wait is not None
        waits.append(wait[0])
        assert await store.claim_batch(worker_id="w", limit=1, lease_seconds=30) == []
        sql.execute("UPDATE runlane.runs SET available_at = now() WHERE id = %s", (run.id,))
    # min(300, 5 * 2^(attempts - 1)) with +/-10% jitter: ~5, ~10, ~20 seconds.
    for wait, base in zip(waits, [5, 10, 20], strict=True):
        assert base * 0.9 - 0.01 <= wait <= base * 1.1 + 0.01


async def test_backoff_is_capped_at_five_minutes(sql: Conn) -> None:
    row = sql.execute("SELECT max(runlane.backoff_seconds(20)) FROM generate_series(1, 50)")
    value = row.fetchone()
    assert value is not None and 270 <= value[0] <= 330


async def test_retry_with_an_explicit_delay(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    run, _ = await service.submit("a", {})
    claimed = await claim_one(store)
    await store.finish_attempt(run.id, claimed.lease_token, Outcome.RETRY, retry_delay_seconds=42)
    wait = sql.execute(
        "SELECT extract(epoch FROM available_at - now())::float FROM runlane.runs"
    ).fetchone()
    assert wait is not None and 41 < wait[0] <= 42


async def test_dead_after_max_attempts_then_requeue_keeps_history(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    run, _ = await service.submit("a", {}, max_attempts=2)
    for _ in range(2):
        claimed = await claim_one(store)
        after = await store.finish_attempt(
            run.id, claimed.lease_token, Outcome.RETRY, retry_delay_seconds=0
        )
        assert after is not None
    assert after.status is RunStatus.DEAD and after.finished_at is not None
    assert await store.claim_batch(worker_id="w", limit=1, lease_seconds=30) == []

    requeued = await service.requeue(run.id)
    assert requeued.status is RunStatus.PENDING and requeued.attempts == 0
    claimed = await claim_one(store)
    assert claimed.attempts == 1
    history = [(a.attempt, a.outcome) for a in await store.list_attempts(run.id)]
    assert history == [(1, "retry"), (2, "retry"), (3, None)]


async def test_requeue_refuses_runs_that_did_not_fail(service: RunService, store: RunStore) -> None:
    run, _ = await service.submit("a", {})
    with pytest.raises(NotRetryable):
        await service.requeue(run.id)
    with pytest.raises(NotFound):
        await service.requeue(uuid.uuid4())
    with pytest.raises(NotFound):
        await service.requeue("not-a-uuid")


async def test_fail_is_final(service: RunService, store: RunStore) -> None:
    run, _ = await service.submit("a", {}, max_attempts=3)
    claimed = await claim_one(store)
    after = await store.finish_attempt(
        run.id, claimed.lease_token, Outcome.FAILED, error={"code": "bad", "message": "no"}
    )
    assert after is not None and after.status is RunStatus.FAILED
    assert after.error == {"code": "bad", "message": "no"}
    assert await store.claim_batch(worker_id="w", limit=1, lease_seconds=30) == []


async def test_released_run_is_claimable_at_once(service: RunService, store: RunStore) -> None:
    run, _ = await service.submit("a", {}, max_attempts=3)
    claimed = await claim_one(store)
    after = await store.finish_attempt(run.id, claimed.lease_token, Outcome.RELEASED)
    assert after is not None and after.status is RunStatus.PENDING
    again = await claim_one(store)
    assert again.attempts == 2


# -- cancel -----------------------------------------------------------------------


async def test_cancel_pending_run_is_immediate(service: RunService, store: RunStore) -> None:
    run, _ = await service.submit("a", {})
    cancelled = await service.cancel(run.id)
    assert cancelled.status is RunStatus.CANCELLED and cancelled.finished_at is not None
    assert await store.claim_batch(worker_id="w", limit=1, lease_seconds=30) == []
    again = await service.cancel(run.id)  # idempotent
    assert again.status is RunStatus.CANCELLED


async def test_cancel_running_run_records_intent_and_owner_confirms(
    service: RunService, store: RunStore
) -> None:
    run, _ = await service.submit("a", {})
    claimed = await claim_one(store)
    first = await service.cancel(run.id)
    second = await service.cancel(run.id)
    assert first.status is second.status is RunStatus.CANCEL_REQUESTED
    done = await store.finish_attempt(run.id, claimed.lease_token, Outcome.CANCELLED)
    assert done is not None and done.status is RunStatus.CANCELLED


async def test_completion_committed_first_wins_over_cancel(
    service: RunService, store: RunStore
) -> None:
    run, _ = await service.submit("a", {})
    claimed = await claim_one(store)
    await service.cancel(run.id)
    done = await store.finish_attempt(run.id, claimed.lease_token, Outcome.COMPLETED, output=1)
    assert done is not None and done.status is RunStatus.COMPLETED
    with pytest.raises(RunFinished):
        await service.cancel(run.id)


@pytest.mark.parametrize("outcome", [Outcome.RETRY, Outcome.RELEASED])
async def test_a_cancel_request_is_not_lost_when_the_attempt_retries_or_is_released(
    service: RunService, store: RunStore, outcome: Outcome
) -> None:
    run, _ = await service.submit("a", {}, max_attempts=3)
    claimed = await claim_one(store)
    await service.cancel(run.id)
    after = await store.finish_attempt(run.id, claimed.lease_token, outcome, retry_delay_seconds=0)
    assert after is not None and after.status is RunStatus.CANCELLED
    assert after.finished_at is not None
    assert await store.claim_batch(worker_id="w", limit=1, lease_seconds=30) == []


async def test_cancel_unknown_run(service: RunService) -> None:
    with pytest.raises(NotFound):
        await service.cancel(uuid.uuid4())


# -- reaper -----------------------------------------------------------------------


async def test_reaper_requeues_with_backoff_then_marks_dead(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    run, _ = await service.submit("a", {}, max_attempts=2)
    await claim_one(store, lease_seconds=0.2)
    await expire_and_reap(store, sql, run.id)
    row = sql.execute(
        "SELECT status, lease_token, extract(epoch FROM available_at - now())::float"
        " FROM runlane.runs"
    ).fetchone()
    assert row is not None and row[0] == "pending" and row[1] is None and 3 < row[2] <= 5.5
    sql.execute("UPDATE runlane.runs SET available_at = now()")
    await claim_one(store, lease_seconds=0.2)
    await expire_and_reap(store, sql, run.id)
    row = sql.execute("SELECT status, error->>'code' FROM runlane.runs").fetchone()
    assert row == ("dead", "lease_expired")
    outcomes = sql.execute("SELECT outcome FROM runlane.run_attempts ORDER BY attempt").fetchall()
    assert outcomes == [("lease_expired",), ("lease_expired",)]


async def test_reaper_cancels_an_expired_cancel_request(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    run, _ = await service.submit("a", {})
    await claim_one(store, lease_seconds=0.2)
    await service.cancel(run.id)
    await expire_and_reap(store, sql, run.id)
    assert sql.execute("SELECT status FROM runlane.runs").fetchone() == ("cancelled",)


async def test_reaper_leaves_live_leases_alone(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    await service.submit("a", {})
    await claim_one(store, lease_seconds=60)
    assert await Reaper(store, interval_seconds=1).sweep() == 0
    assert sql.execute("SELECT status FROM runlane.runs").fetchone() == ("running",)


async def test_one_reaper_at_a_time(service: RunService, store: RunStore, db_url: str) -> None:
    with psycopg.connect(db_url) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s)", (REAPER_LOCK_KEY,))
        assert await store.reap_expired_leases() is None
    assert await store.reap_expired_leases() == []


# -- events and effects -----------------------------------------------------------


async def test_events_are_gap_free_and_resumable(service: RunService, store: RunStore) -> None:
    run, _ = await service.submit("a", {})
    claimed = await claim_one(store)
    seqs = [
        await store.append_event(run.id, claimed.lease_token, "token", {"i": i}) for i in range(5)
    ]
    assert seqs == [1, 2, 3, 4, 5]
    later = await service.events(run.id, after_seq=3)
    assert [(e.seq, e.data) for e in later] == [(4, {"i": 3}), (5, {"i": 4})]


async def test_an_effect_is_recorded_once(service: RunService, store: RunStore) -> None:
    run, _ = await service.submit("a", {})
    claimed = await claim_one(store)
    assert await store.record_effect(run.id, claimed.lease_token, "mail", {"id": 1}) == (
        True,
        {"id": 1},
    )
    assert await store.record_effect(run.id, claimed.lease_token, "mail", {"id": 2}) == (
        True,
        {"id": 1},
    )
    assert await store.get_effect(run.id, "mail") == (True, {"id": 1})
    assert await store.get_effect(run.id, "other") == (False, None)


async def test_listing_pages_with_a_cursor(service: RunService) -> None:
    from runlane.store import RunCursor

    ids = [(await service.submit("a", {"i": i}))[0].id for i in range(7)]
    seen = []
    cursor = None
    while True:
        page = await service.list_runs(limit=3, after=cursor)
        if not page:
            break
        seen.extend(run.id for run in page)
        cursor = RunCursor(page[-1].created_at, page[-1].id)
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen))
    dead = await service.list_runs(statuses=[RunStatus.DEAD])
    assert dead == []


EVERY_STATUS = list(RunStatus)


@pytest.mark.parametrize(
    "statuses",
    [
        ["pending", "running"],
        ["pending", "running", "cancel_requested"],
        ["pending", "failed"],
        ["running", "dead", "interrupted"],
        ["cancel_requested", "cancelled"],
        ["pending", "running", "cancel_requested", "failed", "dead", "cancelled"],
        ["pending", "completed"],
    ],
    ids=str,
)
@pytest.mark.parametrize("tenant", [None, "t0"])
async def test_listing_several_statuses_pages_through_them_newest_first(
    store: RunStore, sql: Conn, statuses: list[str], tenant: str | None
) -> None:
    # Without completed among them, the statuses are listed by one query
    # per index (pending, leased, exceptional) and the pages merged: the
    # merged pages must be the ones a single ordered read gives. Runs of
    # every status, of two tenants, two of each creation time (the run id
    # breaks the tie).
    sql.execute(
        "INSERT INTO runlane.runs (tenant, agent, input, max_attempts, status, lease_token,"
        " lease_expires_at, worker_id, finished_at, created_at)"
        " SELECT 't' || (g / 8 %% 2), 'a', '{}', 3, s.status,"
        " CASE WHEN s.status IN ('running', 'cancel_requested') THEN gen_random_uuid() END,"
        " now() + interval '1 hour', 'w', CASE WHEN s.status NOT IN ('pending', 'running',"
        " 'cancel_requested') THEN now() END,"
        " timestamptz '2026-01-01' + (g / 2) * interval '1 second'"
        " FROM generate_series(0, 47) AS g,"
        " LATERAL (SELECT (%s::text[])[1 + g %% 8] AS status) AS s",
        ([str(s) for s in EVERY_STATUS],),
    )
    wanted = [RunStatus(s) for s in statuses]
    expected = [
        row[0]
        for row in sql.execute(
            "SELECT id FROM runlane.runs WHERE status = ANY(%s)"
            " AND (%s::text IS NULL OR tenant = %s) ORDER BY created_at DESC, id DESC",
            (statuses, tenant, tenant),
        ).fetchall()
    ]
    assert len(expected) >= 6
    seen: list[uuid.UUID] = []
    cursor = None
    while page := await store.list_runs(tenant=tenant, statuses=wanted, limit=4, after=cursor):
        assert len(page) <= 4
        assert {run.status for run in page} <= set(wanted)
        seen += [run.id for run in page]
        cursor = RunCursor(page[-1].created_at, page[-1].id)
    assert seen == expected


@pytest.mark.parametrize(
    "statuses",
    [
        None,
        ["completed"],
        ["pending"],
        ["pending", "running"],
        ["pending", "failed"],
        ["failed"],
        ["dead", "cancelled", "interrupted"],
    ],
    ids=str,
)
@pytest.mark.parametrize("user_id", [None, "u1"])
async def test_listing_without_a_tenant_pages_through_every_tenants_runs(
    store: RunStore, sql: Conn, statuses: list[str] | None, user_id: str | None
) -> None:
    # Without a tenant, every tenant's runs are walked newest first through
    # one index (migration 0044), or, with an owner, tenant by tenant; the
    # rare statuses are read tenant name hash by hash; with more than 16
    # tenants an owner's live runs are read from the live runs' indexes.
    # Every way must give the pages of a single ordered read: 20 tenants,
    # two owners, runs of every status, two of each creation time (the run
    # id breaks the tie).
    sql.execute(
        "INSERT INTO runlane.runs (tenant, user_id, agent, input, max_attempts, status,"
        " lease_token, lease_expires_at, worker_id, finished_at, created_at)"
        " SELECT 't' || (g %% 20), 'u' || (g / 3 %% 2), 'a', '{}', 3, s.status,"
        " CASE WHEN s.status IN ('running', 'cancel_requested') THEN gen_random_uuid() END,"
        " now() + interval '1 hour', 'w', CASE WHEN s.status NOT IN ('pending', 'running',"
        " 'cancel_requested') THEN now() END,"
        " timestamptz '2026-01-01' + (g / 2) * interval '1 second'"
        " FROM generate_series(0, 319) AS g,"
        " LATERAL (SELECT (%s::text[])[1 + g %% 8] AS status) AS s",
        ([str(s) for s in EVERY_STATUS],),
    )
    wanted = [RunStatus(s) for s in statuses] if statuses else None
    expected = [
        row[0]
        for row in sql.execute(
            "SELECT id FROM runlane.runs WHERE (%s::text[] IS NULL OR status = ANY(%s))"
            " AND (%s::text IS NULL OR user_id = %s) ORDER BY created_at DESC, id DESC",
            (statuses, statuses, user_id, user_id),
        ).fetchall()
    ]
    assert len(expected) > 8  # three pages or more
    seen: list[uuid.UUID] = []
    cursor = None
    while page := await store.list_runs(user_id=user_id, statuses=wanted, limit=4, after=cursor):
        assert len(page) <= 4
        seen += [run.id for run in page]
        cursor = RunCursor(page[-1].created_at, page[-1].id)
    assert seen == expected


@pytest.mark.parametrize("user_id", [None, "u"])
async def test_a_tenants_live_runs_behind_its_newer_history_are_all_listed(
    store: RunStore, sql: Conn, user_id: str | None
) -> None:
    # With a tenant, the live listing first walks the tenant's newest runs
    # (10 pages' worth); finding too few live ones there, it reads the live
    # runs' indexes instead. Both ways must give the same pages: here the
    # walk of 20 finds none, and another tenant's live runs stay out.
    sql.execute(
        "INSERT INTO runlane.runs (tenant, user_id, agent, input, max_attempts, created_at)"
        " SELECT t, 'u', 'a', '{}', 3, timestamptz '2026-01-01' + g * interval '1 second'"
        " FROM generate_series(1, 3) AS g, unnest('{t,other}'::text[]) AS t"
    )
    sql.execute(
        "INSERT INTO runlane.runs (tenant, user_id, agent, input, max_attempts, status,"
        " finished_at, created_at)"
        " SELECT 't', 'u', 'a', '{}', 3, 'completed', now(),"
        " timestamptz '2026-02-01' + g * interval '1 second' FROM generate_series(1, 30) AS g"
    )
    expected = [
        row[0]
        for row in sql.execute(
            "SELECT id FROM runlane.runs WHERE tenant = 't' AND status = 'pending'"
            " ORDER BY created_at DESC, id DESC"
        ).fetchall()
    ]
    live = [RunStatus.PENDING, RunStatus.RUNNING]
    first = await store.list_runs(tenant="t", user_id=user_id, statuses=live, limit=2)
    rest = await store.list_runs(
        tenant="t",
        user_id=user_id,
        statuses=live,
        limit=2,
        after=RunCursor(first[-1].created_at, first[-1].id),
    )
    assert [run.id for run in first + rest] == expected


async def test_names_sharing_a_hash_see_only_their_own_runs(
    service: RunService, store: RunStore, sql: Conn
) -> None:
    # The listing of the rare statuses is keyed by hashtext(tenant)
    # (migration 0029; the others are read by name, 0030). These names
    # collide, so only the check of the names themselves keeps one tenant's
    # or owner's runs out of the other's pages and counts.
    t1, t2, u1, u2 = "tenant-60489", "tenant-120827", "user-255858", "user-299228"
    assert sql.execute(
        "SELECT hashtext(%s) = hashtext(%s) AND hashtext(%s) = hashtext(%s)", (t1, t2, u1, u2)
    ).fetchone() == (True,)
    mine = {(await service.submit("a", {}, tenant=t1, user_id=u1))[0].id for _ in range(3)}
    theirs = {(await service.submit("a", {}, tenant=t2, user_id=u1))[0].id for _ in range(2)}
    other_owner = {(await service.submit("a", {}, tenant=t1, user_id=u2))[0].id}

    def ids(runs: list[Any]) -> set[uuid.UUID]:
        return {run.id for run in runs}

    assert ids(await service.list_runs(tenant=t1, user_id=u1)) == mine
    assert ids(await service.list_runs(tenant=t2, user_id=u1)) == theirs
    assert ids(await service.list_runs(tenant=t1)) == mine | other_owner
    assert ids(await service.list_runs(tenant=t1, user_id=u2)) == other_owner
    assert ids(await service.list_runs()) == mine | theirs | other_owner
    assert await store.count_runs_by_status(tenant=t2) == {RunStatus.PENDING: 2}
    for run_id in mine | theirs | other_owner:
        await service.cancel(run_id)
    cancelled = [RunStatus.CANCELLED]
    assert ids(await service.list_runs(tenant=t1, statuses=cancelled)) == mine | other_owner
    assert ids(await service.list_runs(tenant=t2, statuses=cancelled)) == theirs
    assert ids(await service.list_runs(tenant=t1, user_id=u2, statuses=cancelled)) == other_owner
    # An operator's listing skips through the hashes: both tenants share one.
    assert ids(await service.list_runs(statuses=cancelled)) == mine | theirs | other_owner


async def test_idempotency_keys_belong_to_their_user(service: RunService) -> None:
    alice, _ = await service.submit("a", {"q": 1}, idempotency_key="k", user_id="alice")
    bob, created = await service.submit("a", {"q": 1}, idempotency_key="k", user_id="bob")
    again, created_again = await service.submit("a", {"q": 2}, idempotency_key="k", user_id="alice")
    assert created and bob.id != alice.id and bob.user_id == "bob"
    assert not created_again and again.id == alice.id
