"""Bloat: many runs through the system with retention on; table and index
sizes stay bounded.

Rounds of 2,000 runs (20,000 in all; ``--long``: 200,000) go through the
real store: 1,500 direct runs and 500 requests in 100 reused lanes (the
relay dispatches each lane's next request). Each run is claimed in
batches, has its lease renewed, appends an event (and every other run
records an effect), and ends completed (a few failed, a few retried once
first). After each
round the pruner deletes what finished before the previous round ended
(retention: one round), then VACUUM runs, as autovacuum would (the
machine's PostgreSQL runs with autovacuum off, so the test runs it itself),
and the sizes of every runlane table (with its indexes and TOAST) are
recorded. After a warm-up the sizes must stop growing: the last round may
exceed the warm-up round by at most a margin.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import pytest

from runlane.lane_service import LaneService
from runlane.models import ClaimedRun, Outcome, RunStatus
from runlane.store import NewRun, RunStore

T = TypeVar("T")

RUNS_PER_ROUND = 2_000
# Of which requests in lanes (the rest are direct runs).
LANE_RUNS_PER_ROUND = 500
LANES = 100
AGENT = "bloat"
TABLES = ("runs", "run_listing", "run_attempts", "run_events", "run_effects", "requests", "lanes")
# Rounds before sizes are compared: the first rounds fill the free space
# that later rounds reuse.
WARM_UP_ROUNDS = 4
# Allowed growth of each table (with indexes) from the end of warm-up to the
# last round: B-tree pages freed by VACUUM are reused a round or two later,
# so some wobble is normal; steady growth is not.
MARGIN = 0.25
SLACK_BYTES = 256 * 1024


@dataclass(frozen=True)
class Size:
    rounds: int


CI_SIZE = Size(rounds=10)
LONG_SIZE = Size(rounds=100)

SIZES = """
SELECT c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid),
       pg_indexes_size(c.oid), c.reltuples::bigint
FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE n.nspname = 'runlane' AND c.relname = ANY(%s)
"""


async def bounded(limit: int, calls: list[Awaitable[T]]) -> list[T]:
    gate = asyncio.Semaphore(limit)

    async def one(call: Awaitable[T]) -> T:
        async with gate:
            return await call

    return await asyncio.gather(*(one(call) for call in calls))


async def work(store: RunStore, claimed: ClaimedRun) -> None:
    """What a worker writes for one attempt (an event; an effect for every
    other run), then its outcome: mostly completed; every 50th direct run
    fails; every 33rd run is retried once."""
    n = int(claimed.input["n"])
    await store.append_event(claimed.id, claimed.lease_token, "step", {"n": n, "pad": "x" * 64})
    if n % 2 == 0:
        await store.record_effect(claimed.id, claimed.lease_token, "effect", {"ok": True})
    if claimed.lane_id is None and n % 50 == 0:
        outcome = Outcome.FAILED
    elif n % 33 == 0 and claimed.attempts == 1:
        outcome = Outcome.RETRY
    else:
        outcome = Outcome.COMPLETED
    finished = await store.finish_attempt(
        claimed.id,
        claimed.lease_token,
        outcome,
        output={"n": n} if outcome is Outcome.COMPLETED else None,
        error={"code": "x", "message": "bloat"} if outcome is not Outcome.COMPLETED else None,
        retry_delay_seconds=0.0,
        lane_id=claimed.lane_id,
    )
    assert finished is not None


async def one_round(store: RunStore, lanes: LaneService, round_no: int) -> int:
    """Puts RUNS_PER_ROUND runs through; returns how many attempts it took."""
    base = round_no * RUNS_PER_ROUND
    direct = RUNS_PER_ROUND - LANE_RUNS_PER_ROUND
    per_lane = LANE_RUNS_PER_ROUND // LANES
    await bounded(
        8,
        [
            store.insert_run(NewRun(agent=AGENT, input={"n": base + i}, max_attempts=3))
            for i in range(direct)
        ],
    )

    async def submit_lane(lane: int) -> None:
        for i in range(per_lane):
            await lanes.submit(
                tenant="t",
                user_id="u",
                agent=AGENT,
                thread_id=f"lane-{lane}",
                input={"n": base + direct + lane * per_lane + i},
                max_attempts=3,
            )

    await bounded(8, [submit_lane(lane) for lane in range(LANES)])
    attempts = 0
    while True:
        batch = await store.claim_batch(
            worker_id="bloat", limit=500, lease_seconds=60, agents=[AGENT]
        )
        if not batch:
            return attempts
        attempts += len(batch)
        held = await store.renew_leases([(c.id, c.lease_token) for c in batch], lease_seconds=60)
        assert len(held) == len(batch)
        await bounded(8, [work(store, claimed) for claimed in batch])


@pytest.mark.timeout(600)
async def test_sizes_stay_bounded_with_retention(
    store: RunStore,
    lanes: LaneService,
    sql: psycopg.Connection[Any],
    long_mode: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    size = LONG_SIZE if long_mode else CI_SIZE
    history: list[dict[str, tuple[int, int, int, int]]] = []
    pruned_total = [0, 0]
    began = time.monotonic()
    previous_end: float | None = None
    for round_no in range(size.rounds):
        attempts = await one_round(store, lanes, round_no)
        assert attempts > RUNS_PER_ROUND
        # Retention of one round: what finished before the previous round
        # ended goes (with its attempts, events and effects).
        now = sql.execute("SELECT extract(epoch FROM now())::float").fetchone()[0]  # type: ignore[index]
        if previous_end is not None:
            keep = max(now - previous_end, 0.001)
            pruned = await store.prune({status: keep for status in PRUNED})
            assert pruned is not None
            pruned_total[0] += pruned[0]
            pruned_total[1] += pruned[1]
        previous_end = now
        # Autovacuum's job, done here at a known moment.
        sql.execute("VACUUM (ANALYZE) " + ", ".join(f"runlane.{t}" for t in TABLES))
        history.append(
            {
                row[0]: (int(row[1]), int(row[2]), int(row[3]), int(row[4]))
                for row in sql.execute(SIZES, (list(TABLES),)).fetchall()
            }
        )
    seconds = time.monotonic() - began

    counts = dict(sql.execute("SELECT status, count(*) FROM runlane.runs GROUP BY 1").fetchall())
    report = {
        "runs_through": size.rounds * RUNS_PER_ROUND,
        "runs_pruned": pruned_total[0],
        "requests_pruned": pruned_total[1],
        "runs_left": counts,
        "seconds": round(seconds, 1),
        "kib_total_by_round": {
            table: [history[r][table][0] // 1024 for r in range(len(history))] for table in TABLES
        },
        "final_kib_heap_indexes_rows": {
            table: [
                history[-1][table][1] // 1024,
                history[-1][table][2] // 1024,
                history[-1][table][3],
            ]
            for table in TABLES
        },
    }
    with capsys.disabled():
        print(f"\nbloat ({'long' if long_mode else 'CI'} size):")
        for key, value in report.items():
            if isinstance(value, dict) and key.startswith(("kib", "final")):
                print(f"{key}:")
                for table, values in value.items():
                    print(f"  {table:13} {json.dumps(values)}")
            else:
                print(f"{key}: {json.dumps(value)}")

    # Retention works: only the last two rounds' runs are left, none active.
    assert sum(counts.values()) <= 2 * RUNS_PER_ROUND
    assert not {RunStatus.PENDING, RunStatus.RUNNING} & {RunStatus(s) for s in counts}
    assert pruned_total[0] >= (size.rounds - 2) * RUNS_PER_ROUND
    # Sizes stop growing after the warm-up.
    grown = {
        table: (history[WARM_UP_ROUNDS - 1][table][0], history[-1][table][0])
        for table in TABLES
        if history[-1][table][0]
        > history[WARM_UP_ROUNDS - 1][table][0] * (1 + MARGIN) + SLACK_BYTES
    }
    assert grown == {}, f"tables still growing after warm-up (bytes then, now): {grown}"


PRUNED = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.DEAD, RunStatus.CANCELLED)
