"""PGQueuer (>= 1.6) running the same no-op workload, in the same server.

    python -m bench.peers.pgqueuer_adapter serve --url URL --concurrency 50

One QueueManager per process over one psycopg connection (PGQueuer's own
model), ``batch_size = concurrency // 2`` (its dequeue batch; PGQueuer
requires ``max_concurrent_tasks >= 2 * batch_size``) and
``max_concurrent_tasks = concurrency``. Log aggregation is off during the
run so that pgqueuer_log keeps the timestamps the burn-down is read from;
it polls every second besides NOTIFY (``dequeue_timeout``), like runlane's
worker (the throughput and wake-up figures were measured before this
setting was added, with PGQueuer's default of 30 s, which only matters when
a NOTIFY is missed).

``--driver asyncpg`` (the throughput figure's ``pgqueuer-asyncpg``) runs
the same QueueManager over one asyncpg connection instead. On psycopg
PGQueuer waits for notifications inside ``notifies(timeout=1.0)``, holding
its one connection, so its other statements wait until a notification
comes or the second ends; asyncpg delivers notifications to a callback
and never holds the connection for them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from datetime import timedelta
from functools import partial
from typing import Any

import psycopg

from bench.common import (
    AGENT,
    Proc,
    add_at_rate,
    completion_marks,
    count,
    spawn,
    spawn_loader_process,
    system_variant,
)

NAME = "pgqueuer"
# Where the throughput benchmark's start gate takes its lock.
QUEUE_TABLE = "pgqueuer"


def available() -> str | None:
    """None when usable, else why not."""
    try:
        import pgqueuer  # noqa: F401
    except ImportError:
        return "pgqueuer is not installed (pip install 'runlane[bench]')"
    return None


async def _queries(conn: psycopg.AsyncConnection[Any]) -> Any:
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.queries import Queries

    return Queries(PsycopgDriver(conn))


async def _setup(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        queries = await _queries(conn)
        if not await queries.has_table("pgqueuer"):
            await queries.install()


def setup(url: str) -> None:
    asyncio.run(_setup(url))


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")


async def _enqueue(url: str, n: int) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        queries = await _queries(conn)
        chunk = 5000
        for start in range(0, n, chunk):
            size = min(chunk, n - start)
            await queries.enqueue([AGENT] * size, [None] * size, [0] * size)


def enqueue(url: str, n: int) -> None:
    asyncio.run(_enqueue(url, n))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE pgqueuer")


def remaining(url: str) -> int:
    return count(url, "SELECT count(*) FROM pgqueuer")


def window(url: str) -> tuple[float, float]:
    """(first pick, last success) on the database clock, epoch seconds."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            """
            SELECT extract(epoch FROM min(created) FILTER (WHERE status = 'picked')),
                   extract(epoch FROM max(created) FILTER (WHERE status = 'successful')),
                   count(*) FILTER (WHERE status = 'successful')
            FROM pgqueuer_log
            """
        ).fetchone()
    assert row is not None and row[0] is not None and row[1] is not None
    return float(row[0]), float(row[1])


def steady_window(url: str, low: float, high: float) -> tuple[float, float]:
    """See bench.common.completion_marks."""
    return completion_marks(url, "created", "pgqueuer_log WHERE status = 'successful'", low, high)


def done_count(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
        ).fetchone()
    return int(row[0]) if row else 0


def completed(url: str) -> int:
    """Jobs done so far (the wake-up figure's capacity under a loader)."""
    return done_count(url)


def spawn_loader(url: str, rate: float, *, tick_ms: float = 10.0) -> Proc:
    """A process adding ``rate`` no-op jobs/s through PGQueuer's own enqueue
    (one statement a batch, whose trigger notifies its workers), every
    ``tick_ms``, until stopped; it says ready once connected."""
    return spawn_loader_process(
        "bench.peers.pgqueuer_adapter", url, rate, tick_ms, name="pgqueuer loader"
    )


async def _load(url: str, rate: float, tick_ms: float) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        queries = await _queries(conn)

        async def add(batch: int) -> None:
            # No payload: the stamping worker times only the probes.
            await queries.enqueue([AGENT] * batch, [None] * batch, [0] * batch)

        await add_at_rate(rate, tick_ms, add)


def spawn_worker(
    url: str, concurrency: int, *, mode: str = "noop", driver: str = "psycopg"
) -> Proc:
    return spawn(
        "bench.peers.pgqueuer_adapter",
        [
            "serve",
            *("--url", url, "--concurrency", str(concurrency)),
            *("--mode", mode, "--driver", driver),
        ],
        name=f"pgqueuer ({driver}) worker c={concurrency} {mode}",
    )


async def _connect(url: str, driver: str) -> tuple[Any, Any]:
    """(connection, PGQueuer's Queries over it) on the chosen driver."""
    if driver == "asyncpg":
        import asyncpg
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        params = psycopg.conninfo.conninfo_to_dict(url)
        conn = await asyncpg.connect(
            host=params.get("host"),
            port=int(params.get("port") or 5432),
            user=params.get("user"),
            password=params.get("password"),
            database=params.get("dbname"),
        )
        return conn, Queries(AsyncpgDriver(conn))
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    return conn, await _queries(conn)


async def _probe(url: str, n: int, gap: float, driver: str) -> None:
    """Enqueues n jobs one at a time, each carrying time.time() taken just
    before the call (the wake-up latency figure)."""
    conn, queries = await _connect(url, driver)
    try:
        next_at = time.monotonic()
        for _ in range(n):
            await queries.enqueue(AGENT, json.dumps({"t": time.time()}).encode())
            next_at += gap
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        await conn.close()


def probe(url: str, n: int, gap: float, driver: str = "psycopg") -> None:
    asyncio.run(_probe(url, n, gap, driver))


async def _serve(url: str, concurrency: int, mode: str, driver: str) -> None:
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager

    conn, queries = await _connect(url, driver)
    qm = QueueManager(queries)
    latencies: list[float] = []

    if mode == "stamp":

        @qm.entrypoint(AGENT)
        async def stamp(job: Job) -> None:
            started = time.time()
            if job.payload:
                latencies.append(started - json.loads(job.payload)["t"])

    else:

        @qm.entrypoint(AGENT)
        async def noop(job: Job) -> None:
            return None

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, qm.shutdown.set)
    batch = max(1, concurrency // 2)
    print("ready", flush=True)
    try:
        await qm.run(
            # Poll every second as a fallback to NOTIFY, as runlane's worker does.
            dequeue_timeout=timedelta(seconds=1),
            batch_size=batch,
            max_concurrent_tasks=max(concurrency, 2 * batch),
            log_aggregation_interval=timedelta(0),
        )
    finally:
        await conn.close()
        if mode == "stamp":
            print(json.dumps({"latencies": latencies}), flush=True)


def available_on_asyncpg() -> str | None:
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "asyncpg is not installed (pip install 'runlane[bench]')"
    return available()


# PGQueuer with its asyncpg driver, as a system of the throughput and
# wake-up figures: the same tables, jobs and settings, another driver (the
# wake-up's probes enqueue through it too).
ON_ASYNCPG = system_variant(
    sys.modules[__name__],
    NAME="pgqueuer-asyncpg",
    available=available_on_asyncpg,
    spawn_worker=partial(spawn_worker, driver="asyncpg"),
    probe=partial(probe, driver="asyncpg"),
)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.pgqueuer_adapter")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("--url", required=True)
    serve.add_argument("--concurrency", type=int, default=10)
    serve.add_argument("--mode", choices=["noop", "stamp"], default="noop")
    serve.add_argument("--driver", choices=["psycopg", "asyncpg"], default="psycopg")
    loader = sub.add_parser("load")
    loader.add_argument("--url", required=True)
    loader.add_argument("--rate", type=float, required=True)
    loader.add_argument("--tick-ms", type=float, default=10.0)
    args = parser.parse_args()
    if args.command == "load":
        asyncio.run(_load(args.url, args.rate, args.tick_ms))
    else:
        asyncio.run(_serve(args.url, args.concurrency, args.mode, args.driver))


if __name__ == "__main__":
    main()
