"""A wake-up with one commit on its path, in bare SQL: the submit claims for
an idle worker that has parked itself, and its NOTIFY carries the job.

    python -m bench.peers.sql_push_floor serve --url URL

bench.peers.sql_floor is the floor of a queue whose workers pull: the
submit commits, its NOTIFY wakes the worker, the worker's claim commits,
and only then can the handler start; two commits and a round trip in
between. This is what a push design could reach instead: an idle worker
parks (one committed row: "give me the next job"); a submit that finds a
parked worker (FOR UPDATE SKIP LOCKED) deletes that row and inserts the job
already claimed, in its one committed statement, and its NOTIFY names the
worker and carries what the handler needs (here, the submit's timestamp).
The worker takes the "handler start" when that notification arrives: no
claim round trip at all. It then acks the job and parks again, in one
transaction off the measured path. A submit that finds no parked worker
falls back to the pull path (a plain NOTIFY and the worker's claim), so no
job waits for a worker that is busy.

A yardstick for figure 2 (``python -m bench wakeup --peers
sql-push-floor``), not a system: it has no lease, attempt row, retries or
recovery of a job pushed to a worker that dies; what those would add is
what runlane's own statements add to sql_floor's (bench.wakeup_statements).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import psycopg

from bench.common import Proc, spawn
from bench.peers import sql_floor

NAME = "sql-push-floor"
PUSH_CHANNEL = "sql_floor_push"

SCHEMA = """
CREATE TABLE IF NOT EXISTS sql_floor_parked (worker text PRIMARY KEY)
"""
PARK = "INSERT INTO sql_floor_parked (worker) VALUES (%s) ON CONFLICT DO NOTHING"
# One statement, one commit: take a parked worker if one is free, insert the
# job claimed for it (or unclaimed if none), and notify the worker it was
# pushed to (or wake the pullers).
SUBMIT = f"""
WITH parked AS (
    DELETE FROM sql_floor_parked
    WHERE worker = (SELECT worker FROM sql_floor_parked LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING worker
), job AS (
    INSERT INTO sql_floor_jobs (submitted_at, claimed)
    VALUES (%s, EXISTS (SELECT FROM parked))
    RETURNING id, submitted_at, claimed
)
SELECT CASE WHEN job.claimed
            THEN pg_notify('{PUSH_CHANNEL}',
                           concat_ws(' ', (SELECT worker FROM parked), job.id, job.submitted_at))
            ELSE pg_notify('{sql_floor.CHANNEL}', '') END
FROM job
"""


def available() -> str | None:
    """Always usable: it needs nothing but psycopg."""
    return None


def setup(url: str) -> None:
    sql_floor.setup(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)


def reset(url: str) -> None:
    sql_floor.reset(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE sql_floor_parked")


def remaining(url: str) -> int:
    return sql_floor.remaining(url)


def spawn_worker(url: str, concurrency: int, *, mode: str = "stamp") -> Proc:
    if mode != "stamp":
        raise ValueError("the SQL push floor measures wake-ups only (mode 'stamp')")
    return spawn(
        "bench.peers.sql_push_floor",
        ["serve", "--url", url, "--concurrency", str(concurrency)],
        name=f"sql-push-floor worker c={concurrency}",
    )


def probe(url: str, n: int, gap: float) -> None:
    """sql_floor's probe, through the pushing submit."""
    sql_floor.probe(url, n, gap, submit=SUBMIT)


async def _serve(url: str, concurrency: int) -> None:
    me = f"push-floor-{os.getpid()}"
    listener = await psycopg.AsyncConnection.connect(url, autocommit=True)
    claimer = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await listener.execute(f"LISTEN {PUSH_CHANNEL}")
    await listener.execute(f"LISTEN {sql_floor.CHANNEL}")
    latencies: list[float] = []
    pushed: asyncio.Queue[int] = asyncio.Queue()
    pushed_count = 0
    stop = asyncio.Event()
    wake = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def listen() -> None:
        async for notice in listener.notifies():
            if notice.channel != PUSH_CHANNEL:
                wake.set()
                continue
            worker, job_id, submitted = notice.payload.split(" ")
            if worker == me:
                # The handler would start here: the job is already ours.
                latencies.append(time.time() - float(submitted))
                pushed.put_nowait(int(job_id))
                nonlocal pushed_count
                pushed_count += 1

    async def serve_until_stopped() -> None:
        parked = False
        while not stop.is_set():
            wake.clear()
            # Pushed jobs: ack, and park again, in one transaction.
            acks = []
            while not pushed.empty():
                acks.append(pushed.get_nowait())
            if acks:
                parked = False
                async with claimer.transaction():
                    await claimer.execute(sql_floor.ACK, (acks,), prepare=True)
                    await claimer.execute(PARK, (me,), prepare=True)
                parked = True
                continue
            # The pull path, for jobs submitted while no worker was parked.
            cur = await claimer.execute(sql_floor.CLAIM, (concurrency,), prepare=True)
            rows = await cur.fetchall()
            if rows:
                started = time.time()
                latencies.extend(started - submitted for _, submitted in rows)
                await claimer.execute(sql_floor.ACK, ([job_id for job_id, _ in rows],))
                continue
            if not parked:
                await claimer.execute(PARK, (me,), prepare=True)
                parked = True
            getting = asyncio.ensure_future(pushed.get())
            waits = [
                getting,
                asyncio.ensure_future(wake.wait()),
                asyncio.ensure_future(stop.wait()),
            ]
            await asyncio.wait(waits, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()
            if getting.done() and not getting.cancelled():
                pushed.put_nowait(getting.result())

    listening = asyncio.ensure_future(listen())
    print("ready", flush=True)
    try:
        await serve_until_stopped()
    finally:
        listening.cancel()
        await listener.close()
        await claimer.close()
        print(json.dumps({"latencies": latencies, "pushed": pushed_count}), flush=True)


def main() -> None:
    sql_floor.serve_command("python -m bench.peers.sql_push_floor", _serve)


if __name__ == "__main__":
    main()
