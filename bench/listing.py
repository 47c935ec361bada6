"""Listings of runs by status behind a long history: ``RunStore.list_runs``
for sets of statuses, every tenant's page and one tenant's, with the
statistics of a burst.

    python -m bench.listing [--history 300000] [--backlog 0] [--tenants 3]
                            [--failed 0] [--drained 0] [--calls 8]
                            [--src OTHER_CHECKOUT/src] [--tag _s31] [--out-dir DIR]

One database: 40 runs submitted two days ago (10 of them claimed),
``--history`` completed runs newer than those, one every 100 ms, with
``--failed`` that many failed runs among them (one every 100 ms from an
hour before the newest), and with ``--backlog`` that many pending runs
newer still, each set spread over
``--tenants`` tenants (at least 2; ``t1`` is the one tenant listed); then
ANALYZE. With ``--drained``, the backlog's runs are made available as
they were created, and that many of its oldest are then claimed and
completed by two bulk UPDATEs with the table's autovacuum off, as a
draining backlog leaves them until vacuum; every tenant's page of
pending and running runs is listed ``--calls`` times in a row first
(``drained_ms``: each call's time, the first one also compiling and
planning the listing). Each listing asks for a page of 50, ``--calls`` times on one
connection (enough to be prepared), and reports the median of the calls.
With ``--src``, another checkout's runlane lists the same database in a
process of its own, right after this one's (before/after in the same
minutes). The database is migrated by this checkout, so ``--src``
compares the two checkouts' Python and named queries over this
checkout's schema and SQL functions: a change made in a migration's
function shows on both sides (compare runs without ``--src`` instead).
Results: ``bench/results/listing{tag}.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.common import bench_database, median, print_table, run_for_json, write_results

STATUS_SETS: dict[str, list[str] | None] = {
    "pending": ["pending"],
    "running": ["running"],
    "pending, running": ["pending", "running"],
    "pending, running, cancel_requested": ["pending", "running", "cancel_requested"],
    "pending, failed": ["pending", "failed"],
    "running, dead, failed": ["running", "dead", "failed"],
    "completed": ["completed"],
    "any": None,
}
TENANTS: list[str | None] = [None, "t1"]


def fill(url: str, history: int, backlog: int, tenants: int = 3, failed: int = 0) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runlane.runs (tenant, agent, input, max_attempts, created_at)"
            " SELECT 't' || (g %% %(tenants)s), 'a', '{}', 3, now() - interval '2 days'"
            " FROM generate_series(1, 40) AS g",
            {"tenants": tenants},
        )
        conn.execute(
            "INSERT INTO runlane.runs (tenant, agent, input, max_attempts, status, attempts,"
            " finished_at, created_at)"
            " SELECT 't' || (g %% %(tenants)s), 'a', '{}', 3, 'completed', 1, now(),"
            " now() - g * interval '100 ms' FROM generate_series(1, %(n)s) AS g",
            {"tenants": tenants, "n": history},
        )
        if failed:
            conn.execute(
                "INSERT INTO runlane.runs (tenant, agent, input, max_attempts, status, attempts,"
                " finished_at, created_at)"
                " SELECT 't' || (g %% %(tenants)s), 'a', '{}', 3, 'failed', 3, now(),"
                " now() - interval '1 hour' - g * interval '100 ms'"
                " FROM generate_series(1, %(n)s) AS g",
                {"tenants": tenants, "n": failed},
            )
        if backlog:
            conn.execute(
                "INSERT INTO runlane.runs (tenant, agent, input, max_attempts, created_at)"
                " SELECT 't' || (g %% %(tenants)s), 'a', '{}', 3, now() - g * interval '1 ms'"
                " FROM generate_series(1, %(n)s) AS g",
                {"tenants": tenants, "n": backlog},
            )
        conn.execute("VACUUM ANALYZE runlane.runs, runlane.run_listing")


# The backlog's runs: created within the last day, where the fill's first
# runs were created two days ago.
BACKLOG = "status = 'pending' AND created_at > now() - interval '1 day'"


def drain(url: str, drained: int) -> None:
    """The backlog's oldest ``drained`` runs claimed, then completed, with
    no vacuum after: their entries stay in the pending and leased runs'
    indexes, as while a backlog drains between two vacuums."""
    with psycopg.connect(url, autocommit=True) as conn:
        # The fill makes the backlog available at once, in the order of
        # seq, which is the reverse of created_at's: made available as they
        # were created, the oldest are claimed first, as a queue does.
        conn.execute(f"UPDATE runlane.runs SET available_at = created_at WHERE {BACKLOG}")
        conn.execute("VACUUM ANALYZE runlane.runs")
        conn.execute("ALTER TABLE runlane.runs SET (autovacuum_enabled = off)")
        conn.execute(
            f"WITH picked AS (SELECT id FROM runlane.runs WHERE {BACKLOG}"
            " ORDER BY available_at, seq LIMIT %(n)s)"
            " UPDATE runlane.runs AS r SET status = 'running', attempts = 1,"
            " lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour',"
            " worker_id = 'bench-drain' FROM picked WHERE r.id = picked.id",
            {"n": drained},
        )
        conn.execute(
            "UPDATE runlane.runs SET status = 'completed', lease_token = NULL,"
            " lease_expires_at = NULL, finished_at = now()"
            " WHERE status = 'running' AND worker_id = 'bench-drain'"
        )


async def measure_drained(url: str, calls: int) -> list[float]:
    """Every tenant's page of pending and running runs, ``calls`` times in
    a row right after the drain: each call's time (ms)."""
    from runlane.database import create_pool
    from runlane.models import RunStatus
    from runlane.store import RunStore

    pool = create_pool(url, min_size=1, max_size=1, check=False)
    await pool.open()
    await pool.wait()  # the connection made before the first call is timed
    times = []
    try:
        store = RunStore(pool)
        wanted = [RunStatus.PENDING, RunStatus.RUNNING]
        for _ in range(calls):
            started = time.perf_counter()
            await store.list_runs(tenant=None, statuses=wanted, limit=50)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        await pool.close()
    return times


async def measure(url: str, calls: int) -> list[dict[str, Any]]:
    """Each status set and tenant: its page's size and the median time of
    ``calls`` listings (ms). Runs under whichever runlane is importable."""
    from runlane.database import create_pool
    from runlane.models import RunStatus
    from runlane.store import RunStore

    pool = create_pool(url, min_size=1, max_size=1, check=False)
    await pool.open()
    rows = []
    try:
        store = RunStore(pool)
        for tenant in TENANTS:
            for name, statuses in STATUS_SETS.items():
                wanted = [RunStatus(s) for s in statuses] if statuses else None
                times, size = [], 0
                for _ in range(calls):
                    started = time.perf_counter()
                    size = len(await store.list_runs(tenant=tenant, statuses=wanted, limit=50))
                    times.append((time.perf_counter() - started) * 1000)
                rows.append({"tenant": tenant, "statuses": name, "rows": size, "ms": median(times)})
    finally:
        await pool.close()
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    with bench_database("listing") as url:
        fill(url, args.history, args.backlog, args.tenants, args.failed)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "WITH picked AS (SELECT id FROM runlane.runs WHERE status = 'pending'"
                " ORDER BY created_at LIMIT 10)"
                " UPDATE runlane.runs AS r SET status = 'running', attempts = 1,"
                " lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 hour',"
                " worker_id = 'bench-listing' FROM picked WHERE r.id = picked.id"
            )
        drained_ms = None
        if args.drained:
            drain(url, args.drained)
            drained_ms = asyncio.run(measure_drained(url, args.calls))
            print("drained: every tenant's page of pending, running runs, ms:", drained_ms)
        here = asyncio.run(measure(url, args.calls))
        other = None
        if args.src:
            other = run_for_json(
                "bench.listing", ["measure", "--url", url, "--calls", str(args.calls)], src=args.src
            )
    table_rows = []
    for i, row in enumerate(here):
        line = [row["tenant"] or "every", row["statuses"], row["rows"], row["ms"]]
        if other:
            line += [other[i]["ms"], other[i]["ms"] / row["ms"]]
        table_rows.append(line)
    headers = ["tenant", "statuses", "rows", "ms (this checkout)"]
    if other:
        headers += ["ms (--src)", "--src / this"]
    data = {
        "history": args.history,
        "backlog": args.backlog,
        "tenants": args.tenants,
        "failed": args.failed,
        "drained": args.drained,
        "drained_ms": drained_ms,
        "calls": args.calls,
        "src": args.src,
        "rows": here,
        "src_rows": other,
        "table": print_table(headers, table_rows),
    }
    write_results(f"listing{args.tag}", data, out_dir=args.out_dir)
    return data


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["measure"]:
        # The --src side: measure a database another process filled.
        parser = argparse.ArgumentParser(prog="python -m bench.listing measure")
        parser.add_argument("--url", required=True)
        parser.add_argument("--calls", type=int, default=8)
        args = parser.parse_args(argv[1:])
        print(json.dumps(asyncio.run(measure(args.url, args.calls))))
        return
    parser = argparse.ArgumentParser(
        prog="python -m bench.listing", description=(__doc__ or "").strip()
    )
    parser.add_argument("--history", type=int, default=300_000)
    parser.add_argument("--backlog", type=int, default=0)
    parser.add_argument(
        "--tenants", type=int, default=3, help="tenants the runs spread over (>= 2)"
    )
    parser.add_argument("--failed", type=int, default=0, help="failed runs among the history")
    parser.add_argument(
        "--drained", type=int, default=0, help="of the backlog, claimed and completed unvacuumed"
    )
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--src", default=None, help="another checkout's src, measured after")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.drained > args.backlog:
        parser.error("--drained cannot exceed --backlog")
    run(args)


if __name__ == "__main__":
    main()
