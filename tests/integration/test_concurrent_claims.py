"""Eight claimers racing over 2,000 runs, some abandoning their claims."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import psycopg

from runlane.database import create_pool
from runlane.models import Outcome
from runlane.reaper import Reaper
from runlane.store import RunStore

RUNS = 2000
CLAIMERS = 8
LEASE_SECONDS = 0.5


async def test_eight_claimers_never_share_a_leased_run(
    db_url: str, sql: psycopg.Connection[Any]
) -> None:
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts)"
        " SELECT 'noop', jsonb_build_object('i', i), 3 FROM generate_series(1, %s) AS i",
        (RUNS,),
    )
    rng = random.Random(7)
    abandoned: set[Any] = set()
    finished: set[Any] = set()

    async def claimer(name: str) -> None:
        pool = create_pool(db_url, min_size=1, max_size=1)
        await pool.open()
        store = RunStore(pool)
        try:
            idle_since: float | None = None
            while len(finished) < RUNS:
                batch = await store.claim_batch(
                    worker_id=name, limit=5, lease_seconds=LEASE_SECONDS
                )
                if not batch:
                    loop = asyncio.get_running_loop()
                    idle_since = idle_since or loop.time()
                    assert loop.time() - idle_since < 60, "claimers starved"
                    await asyncio.sleep(0.05)
                    continue
                idle_since = None
                for claimed in batch:
                    run_id = claimed.id
                    # 5% of first attempts are abandoned, as by a crashed worker.
                    if claimed.attempts == 1 and rng.random() < 0.05:
                        abandoned.add(run_id)
                        continue
                    done = await store.finish_attempt(
                        run_id, claimed.lease_token, Outcome.COMPLETED, output=name
                    )
                    assert done is not None, "a live lease was refused"
                    finished.add(run_id)
        finally:
            await pool.close()

    async def reaper() -> None:
        pool = create_pool(db_url, min_size=1, max_size=1)
        await pool.open()
        try:
            reaper = Reaper(RunStore(pool), interval_seconds=0.1)
            while len(finished) < RUNS:
                await reaper.sweep()
                # Skip the backoff of reaped runs to keep the test short.
                async with pool.connection() as conn:
                    await conn.execute(
                        "UPDATE runlane.runs SET available_at = now()"
                        " WHERE status = 'pending' AND attempts > 0"
                    )
                await asyncio.sleep(0.1)
        finally:
            await pool.close()

    await asyncio.wait_for(
        asyncio.gather(*(claimer(f"c{i}") for i in range(CLAIMERS)), reaper()), timeout=120
    )

    assert abandoned, "the test should abandon some claims"
    statuses = dict(
        sql.execute("SELECT status, count(*) FROM runlane.runs GROUP BY status").fetchall()  # type: ignore[arg-type]
    )
    assert statuses == {"completed": RUNS}
    # attempts counts every claim, and no run was claimed more than allowed.
    mismatched = sql.execute(
        "SELECT r.id FROM runlane.runs r"
        " JOIN (SELECT run_id, count(*) AS n FROM runlane.attempts GROUP BY run_id) a"
        "   ON a.run_id = r.id"
        " WHERE a.n <> r.attempts OR r.attempts > r.max_attempts"
    ).fetchall()
    assert mismatched == []
    assert sql.execute("SELECT count(*) FROM runlane.attempts").fetchone() == (
        RUNS + len(abandoned),
    )
    # No claim overlapped the previous attempt's live lease: each later
    # claim started after the earlier lease ran out (by the database clock).
    overlaps = sql.execute(
        "SELECT a.run_id FROM runlane.attempts a"
        " JOIN runlane.attempts b ON b.run_id = a.run_id AND b.attempt = a.attempt + 1"
        " WHERE b.started_at < a.started_at + make_interval(secs => %s)",
        (LEASE_SECONDS,),
    ).fetchall()
    assert overlaps == []
    assert sql.execute(
        "SELECT count(*) FROM runlane.attempts WHERE outcome = 'lease_expired'"
    ).fetchone() == (len(abandoned),)
