"""The floor of a durable PostgreSQL queue's wake-up, in bare SQL: no queue
library, only what any such queue has to do between a submit and a handler.

    python -m bench.peers.sql_floor serve --url URL --concurrency 10

The submit is one statement: the INSERT of a narrow row and its NOTIFY,
committed (the commit waits for the WAL flush, as runlane's and every peer's
submit does). The worker LISTENs on one connection; at each notification it
claims on a second connection, one autocommit statement (an UPDATE of up to
``concurrency`` unclaimed rows, chosen with FOR UPDATE SKIP LOCKED, also
committed), and takes the "handler start" the moment the claim answers: no
handler dispatch, no lease, no attempt row, no Python queue library. It
deletes what it claimed afterwards (the ack, off the measured path), and
polls every second besides NOTIFY, as the other workers do.

It is a yardstick for figure 2 (``python -m bench wakeup --peers
sql-floor``): the same probes, the same pause between them, the same
machine; whatever part of the wake-up latency this floor already takes, no
queue on this machine can go below. Not a system for the throughput figure
(pgbench's claim + ack is that figure's bare-SQL yardstick). Under the
figure's load its loader inserts jobs without a time in batches, one
statement and one NOTIFY a batch, and only the probes are timed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

import psycopg

from bench.common import Proc, add_at_rate, count, spawn, spawn_loader_process

NAME = "sql-floor"
CHANNEL = "sql_floor_wakeup"

SCHEMA = """
CREATE TABLE IF NOT EXISTS sql_floor_jobs (
    id bigserial PRIMARY KEY,
    submitted_at double precision NOT NULL,
    claimed boolean NOT NULL DEFAULT false
)
"""
SUBMIT = f"""
WITH job AS (INSERT INTO sql_floor_jobs (submitted_at) VALUES (%s) RETURNING id)
SELECT pg_notify('{CHANNEL}', '') FROM job
"""
CLAIM = """
UPDATE sql_floor_jobs SET claimed = true
WHERE id IN (SELECT id FROM sql_floor_jobs WHERE NOT claimed ORDER BY id
             LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id, submitted_at
"""
ACK = "DELETE FROM sql_floor_jobs WHERE id = ANY(%s)"
# The loaded phase's jobs: submitted_at 0 (no probe's time), one NOTIFY a batch.
LOAD = f"""
WITH jobs AS (
    INSERT INTO sql_floor_jobs (submitted_at) SELECT 0 FROM generate_series(1, %s) RETURNING id
)
SELECT pg_notify('{CHANNEL}', '') FROM (SELECT count(*) FROM jobs) AS added
"""


def available() -> str | None:
    """Always usable: it needs nothing but psycopg."""
    return None


def setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE sql_floor_jobs")


def remaining(url: str) -> int:
    return count(url, "SELECT count(*) FROM sql_floor_jobs")


def completed(url: str) -> int:
    """Jobs claimed so far: every job ever inserted (the id sequence, which
    a reset does not restart) less those still in the table, as each claim
    deletes what it took."""
    return count(
        url,
        """
        SELECT (SELECT CASE WHEN is_called THEN last_value ELSE 0 END
                FROM sql_floor_jobs_id_seq)
               - (SELECT count(*) FROM sql_floor_jobs)
        """,
    )


def spawn_loader(url: str, rate: float, *, tick_ms: float = 10.0) -> Proc:
    """A process adding ``rate`` jobs/s, a batch and its NOTIFY in one
    statement every ``tick_ms``, until stopped; it says ready once
    connected."""
    return spawn_loader_process(
        "bench.peers.sql_floor", url, rate, tick_ms, name="sql-floor loader"
    )


async def _load(url: str, rate: float, tick_ms: float) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:

        async def add(batch: int) -> None:
            await conn.execute(LOAD, (batch,), prepare=True)

        await add_at_rate(rate, tick_ms, add)


def spawn_worker(url: str, concurrency: int, *, mode: str = "stamp") -> Proc:
    if mode != "stamp":
        raise ValueError("the SQL floor measures wake-ups only (mode 'stamp')")
    return spawn(
        "bench.peers.sql_floor",
        ["serve", "--url", url, "--concurrency", str(concurrency)],
        name=f"sql-floor worker c={concurrency}",
    )


async def _probe(url: str, n: int, gap: float, submit: str) -> None:
    """Submits n jobs one at a time with ``submit``, each carrying
    time.time() taken just before the call, one every ``gap`` seconds
    (open loop)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        next_at = time.monotonic()
        for _ in range(n):
            await conn.execute(submit, (time.time(),), prepare=True)
            next_at += gap
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))


def probe(url: str, n: int, gap: float, *, submit: str = SUBMIT) -> None:
    asyncio.run(_probe(url, n, gap, submit))


async def _serve(url: str, concurrency: int) -> None:
    listener = await psycopg.AsyncConnection.connect(url, autocommit=True)
    claimer = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await listener.execute(f"LISTEN {CHANNEL}")
    latencies: list[float] = []
    stop = asyncio.Event()
    wake = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def listen() -> None:
        async for _ in listener.notifies():
            wake.set()

    async def claim_until_stopped() -> None:
        while not stop.is_set():
            # Cleared before the claim: a NOTIFY that arrives while the claim
            # is on its way sets it again, and the next claim follows at once.
            wake.clear()
            cur = await claimer.execute(CLAIM, (concurrency,), prepare=True)
            rows: list[Any] = await cur.fetchall()
            started = time.time()
            if rows:
                # The loaded phase's jobs carry no time (0): only probes count.
                latencies.extend(started - submitted for _, submitted in rows if submitted > 0)
                await claimer.execute(ACK, ([job_id for job_id, _ in rows],), prepare=True)
                continue  # more may be waiting
            waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waits, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()

    listening = asyncio.ensure_future(listen())
    print("ready", flush=True)
    try:
        await claim_until_stopped()
    finally:
        listening.cancel()
        await listener.close()
        await claimer.close()
        print(json.dumps({"latencies": latencies}), flush=True)


def serve_command(prog: str, serve: Callable[[str, int], Coroutine[Any, Any, None]]) -> None:
    """``prog serve --url URL --concurrency N``: a floor's worker process;
    ``prog load --url URL --rate R``: the loaded phase's loader."""
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)
    serving = sub.add_parser("serve")
    serving.add_argument("--url", required=True)
    serving.add_argument("--concurrency", type=int, default=10)
    loading = sub.add_parser("load")
    loading.add_argument("--url", required=True)
    loading.add_argument("--rate", type=float, required=True)
    loading.add_argument("--tick-ms", type=float, default=10.0)
    args = parser.parse_args()
    if args.command == "load":
        asyncio.run(_load(args.url, args.rate, args.tick_ms))
    else:
        asyncio.run(serve(args.url, args.concurrency))


def main() -> None:
    serve_command("python -m bench.peers.sql_floor", _serve)


if __name__ == "__main__":
    main()
