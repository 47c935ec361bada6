"""Soak: do heartbeats stay HOT updates, and do dead tuples stay bounded?

One worker holds ``--long-runs`` runs (default 200) for the whole soak, each
renewing its lease every ``--heartbeat-seconds`` (1 s) through the worker's
one-statement-per-tick renewal, while a steady flow of short runs
(``--short-rate`` per second, each emitting one event) is submitted, claimed
and completed. Every ``--sample-seconds`` (60) the soak reads
``pg_stat_user_tables`` for ``runlane.runs`` (n_tup_upd, n_tup_hot_upd,
n_live_tup, n_dead_tup, autovacuum runs) and the table's heap and index
sizes, prints a row, and at the end prints a summary and writes everything
as JSON (``--out``, default ``bench/results/soak-<UTC time>.json``).

    python bench/soak.py --admin-url postgresql://postgres@127.0.0.1:5432/test \
        --minutes 30

``--admin-url`` creates a fresh database on that server for the soak (and
drops it afterwards unless ``--keep-database``); ``--database-url`` (default
``$RUNLANE_DATABASE_URL``) uses an existing one, migrating it first.
``--minutes 0.05`` is a smoke run of a few seconds (samples shrink to fit).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo
from psycopg.rows import dict_row

import runlane
from runlane.database import create_pool
from runlane.migrations import migrate
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import RunStore
from runlane.worker import Worker

HERE = Path(__file__).resolve().parent
LONG_AGENT = "soak-long"
SHORT_AGENT = "soak-short"
MB = 1024 * 1024
SETTLE_SECONDS = 12.0

TABLE_STATS = """
SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_live_tup, n_dead_tup,
       autovacuum_count, autoanalyze_count, vacuum_count, last_autovacuum, last_autoanalyze
FROM pg_stat_user_tables
WHERE schemaname = 'runlane' AND relname IN ('runs', 'run_events', 'run_attempts', 'workers')
"""
SIZES = """
SELECT pg_relation_size('runlane.runs') AS heap_bytes,
       pg_table_size('runlane.runs') AS table_bytes,
       pg_indexes_size('runlane.runs') AS index_bytes,
       pg_total_relation_size('runlane.run_events') AS events_bytes,
       pg_total_relation_size('runlane.run_attempts') AS attempts_bytes,
       pg_total_relation_size('runlane.workers') AS workers_bytes,
       (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database())
           AS connections
"""
# Exact dead tuples: pgstattuple_approx reads every page the visibility map
# does not mark all-visible (the only pages that can hold dead tuples), so
# its dead_tuple_count is exact, unlike n_dead_tup, which ANALYZE resets
# to an extrapolation from its sample.
APPROX = """
SELECT dead_tuple_count, dead_tuple_percent, approx_free_percent, scanned_percent
FROM pgstattuple_approx('runlane.runs')
"""
INDEX_SIZES = """
SELECT indexrelname AS name, pg_relation_size(indexrelid) AS bytes
FROM pg_stat_user_indexes WHERE schemaname = 'runlane' AND relname = 'runs'
ORDER BY indexrelname
"""


# -- the agents -------------------------------------------------------------------


@dataclass
class Soak:
    """What the agents share with the driver."""

    stop_long: asyncio.Event = field(default_factory=asyncio.Event)
    long_started: int = 0
    short_done: int = 0


def build_app(settings: Settings, soak: Soak, short_events: int) -> runlane.App:
    app = runlane.App(settings)

    @app.agent(LONG_AGENT)
    async def long_run(ctx: runlane.RunContext) -> dict[str, Any]:
        """Holds its lease (heartbeats renew it) until the soak ends."""
        soak.long_started += 1
        while not soak.stop_long.is_set():
            await ctx.safe_point()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(soak.stop_long.wait(), timeout=1.0)
        return {"held": True}

    @app.agent(SHORT_AGENT)
    async def short_run(ctx: runlane.RunContext) -> dict[str, Any]:
        for n in range(short_events):
            await ctx.emit("token", {"n": n})
        soak.short_done += 1
        return {"ok": True}

    return app


# -- sampling ---------------------------------------------------------------------


async def sample(
    conn: psycopg.AsyncConnection[Any], t: float, extra: dict[str, Any], *, approx: bool
) -> dict[str, Any]:
    tables = {row["relname"]: row for row in await (await conn.execute(TABLE_STATS)).fetchall()}
    sizes = await (await conn.execute(SIZES)).fetchone()
    indexes = await (await conn.execute(INDEX_SIZES)).fetchall()
    assert sizes is not None
    if approx:
        extra = {**extra, "pgstattuple_approx": await (await conn.execute(APPROX)).fetchone()}

    def plain(row: dict[str, Any]) -> dict[str, Any]:
        return {
            k: (v.isoformat() if isinstance(v, datetime) else v)
            for k, v in row.items()
            if k != "relname"
        }

    return {
        "t": round(t, 1),
        "runs": plain(tables["runs"]),
        "tables": {name: plain(row) for name, row in tables.items() if name != "runs"},
        "sizes": dict(sizes),
        "index_bytes": {row["name"]: row["bytes"] for row in indexes},
        **extra,
    }


def ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


HEADER = (
    f"{'t (min)':>7} {'updates':>9} {'HOT':>9} {'HOT %':>6} {'live':>8} {'dead':>7} "
    f"{'dead*':>7} {'heap MB':>8} {'index MB':>9} {'autovac':>7} {'renewals':>9} "
    f"{'short done':>10} {'conns':>5}"
)


def row_line(first: dict[str, Any], prev: dict[str, Any], cur: dict[str, Any]) -> str:
    r, p = cur["runs"], prev["runs"]
    upd = r["n_tup_upd"] - p["n_tup_upd"]
    hot = r["n_tup_hot_upd"] - p["n_tup_hot_upd"]
    return (
        f"{cur['t'] / 60:>7.2f} {upd:>9} {hot:>9} {pct(ratio(hot, upd)):>6} "
        f"{r['n_live_tup']:>8} {r['n_dead_tup']:>7} {exact_dead(cur) or '-':>7} "
        f"{cur['sizes']['heap_bytes'] / MB:>8.2f} {cur['sizes']['index_bytes'] / MB:>9.2f} "
        f"{r['autovacuum_count'] - first['runs']['autovacuum_count']:>7} "
        f"{cur['renewals'] - first['renewals']:>9.0f} "
        f"{cur['short_done'] - first['short_done']:>10} {cur['sizes']['connections']:>5}"
    )


def exact_dead(sample: dict[str, Any]) -> int | None:
    approx = sample.get("pgstattuple_approx")
    return None if approx is None else int(approx["dead_tuple_count"])


def summarize(samples: list[dict[str, Any]], minutes: float) -> dict[str, Any]:
    first, last = samples[0], samples[-1]
    f, l_ = first["runs"], last["runs"]
    upd = l_["n_tup_upd"] - f["n_tup_upd"]
    hot = l_["n_tup_hot_upd"] - f["n_tup_hot_upd"]
    short_done = last["short_done"] - first["short_done"]
    renewals = last["renewals"] - first["renewals"]
    # Each short run changes its status twice (claim, finish): those
    # updates change indexed columns and cannot be HOT. Everything else on
    # runs here (lease renewals, event counter bumps) could be.
    status_updates = 2 * short_done
    dead = [s["runs"]["n_dead_tup"] for s in samples]
    elapsed_min = (last["t"] - first["t"]) / 60 or minutes
    return {
        "minutes": round(elapsed_min, 2),
        "updates": upd,
        "hot_updates": hot,
        "hot_ratio": ratio(hot, upd),
        "lease_renewals": renewals,
        "short_runs_completed": short_done,
        "status_change_updates_estimate": status_updates,
        "hot_ratio_of_other_updates_estimate": ratio(hot, upd - status_updates),
        "dead_tuples_first": dead[0],
        "dead_tuples_max": max(dead),
        "dead_tuples_last": dead[-1],
        "dead_tuple_growth_per_minute": (dead[-1] - dead[0]) / elapsed_min,
        "exact_dead_tuples": [exact_dead(s) for s in samples],
        "live_tuples_last": l_["n_live_tup"],
        "heap_mb_first": first["sizes"]["heap_bytes"] / MB,
        "heap_mb_last": last["sizes"]["heap_bytes"] / MB,
        "index_mb_first": first["sizes"]["index_bytes"] / MB,
        "index_mb_last": last["sizes"]["index_bytes"] / MB,
        "autovacuums": l_["autovacuum_count"] - f["autovacuum_count"],
        "autoanalyzes": l_["autoanalyze_count"] - f["autoanalyze_count"],
        "max_connections_used": max(s["sizes"]["connections"] for s in samples),
    }


# -- the machine ------------------------------------------------------------------


def machine(url: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        info["memory"] = subprocess.run(
            ["free", "-h"], capture_output=True, text=True, check=True
        ).stdout.splitlines()[1]
    except (OSError, subprocess.CalledProcessError, IndexError):
        info["memory"] = None
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT version()").fetchone()
        info["postgresql"] = row[0] if row else None
        info["pg_settings"] = {
            name: setting
            for name, setting in conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('autovacuum',"
                " 'autovacuum_naptime', 'autovacuum_vacuum_scale_factor',"
                " 'autovacuum_vacuum_threshold', 'autovacuum_vacuum_insert_scale_factor',"
                " 'shared_buffers', 'max_connections')"
            ).fetchall()
        }
        fill = conn.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'runlane.runs'::regclass"
        ).fetchone()
        info["runs_reloptions"] = fill[0] if fill else None
    return info


# -- the soak ---------------------------------------------------------------------

HISTORY = """
INSERT INTO runlane.runs (agent, input, output, max_attempts, status, attempts, claim_count,
                          available_at, created_at, started_at, finished_at)
SELECT 'soak-history', jsonb_build_object('i', g), '{"ok": true}', 3, 'completed', 1, 1,
       at, at, at, at + interval '1 second'
FROM generate_series(1, %(rows)s) AS g,
     LATERAL (SELECT now() - interval '6 days' * (1 - g::float8 / %(rows)s)) AS t(at)
"""


def load_history(url: str, rows: int) -> None:
    """Finished runs of the last 6 days (inside the 7-day retention, so the
    pruner keeps them): the table a long-lived deployment has, which sets
    autovacuum's scale-factor thresholds. Vacuumed and analysed after."""
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(HISTORY, {"rows": rows})
    # A new session: the insert's statistics are flushed when its session
    # ends, and must land before VACUUM sets the live count.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) runlane.runs")
    print(f"loaded {rows} finished runs of history in {time.monotonic() - started:.0f}s")


async def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"soak: timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.1)


async def produce(service: RunService, rate: float, stop: asyncio.Event) -> int:
    """Submits short runs at ``rate`` per second until ``stop``."""
    submitted = 0
    started = time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - started) * rate) - submitted
        for _ in range(max(due, 0)):
            await service.submit(SHORT_AGENT, {"i": submitted}, max_attempts=3)
            submitted += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.1)
    return submitted


async def soak(args: argparse.Namespace, url: str) -> dict[str, Any]:
    duration = args.minutes * 60
    interval = min(args.sample_seconds, max(duration / 3, 0.5))
    lease = max(args.lease_seconds, 3 * args.heartbeat_seconds)
    settings = Settings(
        database_url=url,
        heartbeat_seconds=args.heartbeat_seconds,
        lease_seconds=lease,
        poll_seconds=1.0,
        data_dir=Path("/nonexistent-runlane-soak"),
    )
    state = Soak()
    app = build_app(settings, state, args.short_events)
    pool = create_pool(url, min_size=1, max_size=4)
    await pool.open(wait=True, timeout=15)
    stats = await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)
    service = RunService(RunStore(pool), settings)
    worker = Worker(
        app, url, concurrency=args.long_runs + args.short_concurrency, settings=settings
    )

    def extra() -> dict[str, Any]:
        renewals = worker.metrics.registry.get_sample_value("runlane_worker_lease_renewals_total")
        return {
            "renewals": renewals or 0.0,
            "short_done": state.short_done,
            "long_running": state.long_started,
        }

    samples: list[dict[str, Any]] = []
    print(
        f"soak: {args.long_runs} long runs (heartbeat {args.heartbeat_seconds:g}s, lease"
        f" {lease:g}s), {args.short_rate:g} short runs/s, {args.minutes:g} min,"
        f" sample every {interval:g}s",
        flush=True,
    )
    try:
        for i in range(args.long_runs):
            await service.submit(LONG_AGENT, {"i": i}, max_attempts=3)
        await worker.start()

        async def all_long_running() -> bool:
            return bool(state.long_started >= args.long_runs)

        await wait_for(all_long_running, 120, "the long runs to start")
        # Backends report table statistics lazily (PostgreSQL 15: at most
        # once a second, within 10 s when idle): let the long runs' claims
        # land before the baseline, so that they do not count as soak work.
        await asyncio.sleep(min(SETTLE_SECONDS, duration / 3))
        stop_producer = asyncio.Event()
        started = time.monotonic()
        samples.append(await sample(stats, 0.0, extra(), approx=args.pgstattuple))
        print(HEADER, flush=True)
        print(row_line(samples[0], samples[0], samples[0]), flush=True)
        producer = asyncio.create_task(produce(service, args.short_rate, stop_producer))
        next_at = started + interval
        while True:
            now = time.monotonic()
            end = started + duration
            await asyncio.sleep(max(0.0, min(next_at, end) - now))
            now = time.monotonic()
            if producer.done():
                producer.result()  # surface its error
            samples.append(await sample(stats, now - started, extra(), approx=args.pgstattuple))
            print(row_line(samples[0], samples[-2], samples[-1]), flush=True)
            if now >= end - 0.01:
                break
            next_at += interval
        stop_producer.set()
        submitted = await producer
        lost = worker.metrics.registry.get_sample_value("runlane_worker_leases_lost_total")
    finally:
        state.stop_long.set()
        await worker.stop(grace_seconds=30)
        await stats.close()
        await pool.close()
    summary = summarize(samples, args.minutes)
    summary["short_runs_submitted"] = submitted
    summary["leases_lost"] = lost or 0.0
    return {"samples": samples, "summary": summary, "sample_seconds": interval}


def print_summary(summary: dict[str, Any]) -> None:
    print()
    print(f"over {summary['minutes']:.2f} min on runlane.runs:")
    print(
        f"  updates {summary['updates']}, HOT {summary['hot_updates']}:"
        f" HOT ratio {pct(summary['hot_ratio'])}"
    )
    print(
        f"  lease renewals {summary['lease_renewals']:.0f}, short runs completed"
        f" {summary['short_runs_completed']} (submitted {summary['short_runs_submitted']}),"
        f" leases lost {summary['leases_lost']:.0f}"
    )
    print(
        f"  without the {summary['status_change_updates_estimate']} status changes of short"
        f" runs (claim, finish: never HOT), HOT ratio"
        f" {pct(summary['hot_ratio_of_other_updates_estimate'])}"
    )
    print(
        f"  dead tuples: {summary['dead_tuples_first']} at start, max"
        f" {summary['dead_tuples_max']}, {summary['dead_tuples_last']} at end"
        f" ({summary['dead_tuple_growth_per_minute']:+.1f}/min; n_dead_tup);"
        f" autovacuum ran {summary['autovacuums']} times"
    )
    exact = [n for n in summary["exact_dead_tuples"] if n is not None]
    if exact:
        print(
            f"  dead tuples counted by pgstattuple_approx (dead* column): {exact[0]} at start,"
            f" max {max(exact)}, {exact[-1]} at end"
        )
    print(
        f"  heap {summary['heap_mb_first']:.2f} -> {summary['heap_mb_last']:.2f} MB, indexes"
        f" {summary['index_mb_first']:.2f} -> {summary['index_mb_last']:.2f} MB,"
        f" {summary['live_tuples_last']} live rows; up to"
        f" {summary['max_connections_used']} connections"
    )


def with_dbname(url: str, dbname: str) -> str:
    params = pg_conninfo.conninfo_to_dict(url)
    params["dbname"] = dbname
    return pg_conninfo.make_conninfo(**params)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="soak length (30)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--database-url",
        default=os.environ.get("RUNLANE_DATABASE_URL"),
        help="an existing database (default $RUNLANE_DATABASE_URL)",
    )
    where.add_argument("--admin-url", help="create a fresh database on this server")
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument("--long-runs", type=int, default=200)
    parser.add_argument("--heartbeat-seconds", type=float, default=1.0)
    parser.add_argument("--lease-seconds", type=float, default=10.0)
    parser.add_argument("--short-rate", type=float, default=10.0, help="short runs per second")
    parser.add_argument("--short-concurrency", type=int, default=16)
    parser.add_argument("--short-events", type=int, default=1, help="events per short run")
    parser.add_argument("--sample-seconds", type=float, default=60.0)
    parser.add_argument(
        "--table-options",
        help="storage options set on runlane.runs first, e.g."
        " 'autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000'",
    )
    parser.add_argument(
        "--history-rows",
        type=int,
        default=0,
        help="finished runs to load first (a long-lived table; default none)",
    )
    parser.add_argument(
        "--pgstattuple",
        action="store_true",
        help="also count dead tuples exactly at each sample with pgstattuple_approx"
        " (creates the extension: needs the contrib package and the right to create it)",
    )
    parser.add_argument("--out", type=Path, help="the JSON results file")
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error("--minutes must be positive")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")

    created: str | None = None
    if args.admin_url:
        created = f"runlane_soak_{datetime.now(UTC):%Y%m%d_%H%M%S}_{uuid.uuid4().hex[:4]}"
        with psycopg.connect(args.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{created}"')
        url = with_dbname(args.admin_url, created)
    elif args.database_url:
        url = args.database_url
    else:
        parser.error("give --database-url (or RUNLANE_DATABASE_URL) or --admin-url")
    started_at = datetime.now(UTC)
    try:
        migrate(url)
        if args.table_options:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"ALTER TABLE runlane.runs SET ({args.table_options})")
        if args.history_rows:
            load_history(url, args.history_rows)
        if args.pgstattuple:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        info = machine(url)
        print(
            f"PostgreSQL: {info['postgresql']}; autovacuum"
            f" {info['pg_settings'].get('autovacuum')}; runlane.runs options"
            f" {info['runs_reloptions']}",
            flush=True,
        )
        if info["pg_settings"].get("autovacuum") != "on":
            print("note: autovacuum is off on this server: dead tuples are never vacuumed")
        result = asyncio.run(soak(args, url))
    finally:
        if created and not args.keep_database:
            with psycopg.connect(args.admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{created}" WITH (FORCE)')
    print_summary(result["summary"])
    out = args.out or HERE / "results" / f"soak-{started_at:%Y%m%dT%H%M%SZ}-{os.getpid()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started_at": started_at.isoformat(),
        "database": created or "(given)",
        "machine": info,
        "params": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("database_url", "admin_url")
        },
        **result,
    }
    out.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
