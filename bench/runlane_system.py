"""runlane behind the same small interface as the peer adapters: set up,
reset, bulk-enqueue, count what remains, read the burn-down window, start a
worker process."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from bench.common import AGENT, Proc, completion_marks, count, spawn
from runlane.migrations import available_migrations

NAME = "runlane"
# Where the throughput benchmark's start gate takes its lock.
QUEUE_TABLE = "runlane.runs"


def available() -> str | None:
    return None


def setup(url: str) -> None:
    from runlane.migrations import migrate

    migrate(url)


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        # A worker kept across resets (the wake-up benchmark's) renews its
        # leases and its workers row while the TRUNCATE takes its tables one
        # by one, so either can be chosen as a deadlock's victim (the fifth
        # session saw both): the worker retries its heartbeat, this retries.
        for attempt in range(5):
            try:
                conn.execute(
                    "TRUNCATE runlane.runs, runlane.run_attempts, runlane.run_events,"
                    " runlane.run_effects, runlane.requests, runlane.lanes,"
                    " runlane.workers CASCADE"
                )
                break
            except psycopg.errors.DeadlockDetected:
                if attempt == 4:
                    raise
        # Not in the TRUNCATE: a worker still running (the wake-up benchmark
        # keeps one across resets) reads tenant_limits before runs in every
        # claim, and TRUNCATE locks runs first, so taking both would deadlock.
        conn.execute("DELETE FROM runlane.tenant_limits")
        # Undo the experiment of bench.runlane_variants, if one ran before.
        conn.execute("ALTER TABLE runlane.runs ENABLE TRIGGER runs_notify_status")
        # Migrations that an experiment undid for its trials, put back.
        for applied, restore in RESTORES:
            row = conn.execute(applied).fetchone()
            if row and not row[0]:
                conn.execute(restore().encode())


# 0030's listing as runlane-listing-on-runs leaves it: the listing rows
# written at the insert again, the indexes on runs gone. The runs and their
# listing rows are gone by then (the TRUNCATE above).
LISTING_RESTORED = (
    "DROP INDEX runlane.runs_listing_idx, runlane.runs_owner_listing_idx;"
    " DROP STATISTICS runlane.runs_user_hash_stats;"
    " CREATE TRIGGER runs_list_inserted AFTER INSERT ON runlane.runs"
    " REFERENCING NEW TABLE AS inserted_runs"
    " FOR EACH STATEMENT EXECUTE FUNCTION runlane.list_inserted_runs();"
    " CREATE TRIGGER runs_refuse_relisting"
    " BEFORE UPDATE OF tenant, user_id, created_at ON runlane.runs"
    " FOR EACH ROW EXECUTE FUNCTION runlane.refuse_relisting()"
)

# (a query answering whether a migration's work is in effect, the SQL that
# puts it back): the claim's settings of 0012 (runlane-claim-planned-each-
# call resets them); the listing of 0030 (runlane-listing-on-runs puts the
# listing indexes back on runs); the attempt rows of 0035, written at the
# attempt's end (runlane-attempts-at-claim puts back the claim of 0034 and
# the outcome write of 0032, which wrote them at the claim; the functions'
# latest versions come back).
RESTORES: tuple[tuple[str, Callable[[], str]], ...] = (
    (
        "SELECT 'plan_cache_mode=force_generic_plan' = ANY(proconfig) FROM pg_proc"
        " WHERE oid = 'runlane.claim_uncapped_runs'::regproc",
        lambda: migration_sql(12),
    ),
    (
        "SELECT EXISTS (SELECT FROM pg_trigger WHERE tgname = 'runs_list_inserted'"
        " AND tgrelid = 'runlane.runs'::regclass)",
        lambda: LISTING_RESTORED,
    ),
    (
        "SELECT prosrc LIKE '%attempt_started_at%' FROM pg_proc"
        " WHERE oid = 'runlane.claim_uncapped_runs'::regproc",
        lambda: (
            "ALTER TABLE runlane.run_attempts SET (fillfactor = 100); "
            + "; ".join(
                latest_function(name)
                for name in ("claim_uncapped_runs", "claim_capped_runs", "finish_attempts")
            )
        ),
    ),
)


def migration_sql(version: int) -> str:
    """The SQL of one of runlane's migrations (experiments put pieces back)."""
    return next(m.sql for m in available_migrations() if m.version == version)


def latest_function(name: str) -> str:
    """The definition of function runlane.``name`` in the last migration
    that defines it: what an experiment that replaced it puts back."""
    marker = f"CREATE OR REPLACE FUNCTION runlane.{name}("
    version = max(m.version for m in available_migrations() if marker in m.sql)
    return migration_function(version, name)


def migration_function(version: int, name: str) -> str:
    """The definition of function runlane.``name`` in one migration."""
    sql = migration_sql(version)
    start = sql.index(f"CREATE OR REPLACE FUNCTION runlane.{name}(")
    body = sql.index("AS $$", start)
    return sql[start : sql.index("$$;", body + len("AS $$")) + len("$$;")]


def insert_pending(conn: psycopg.Connection[Any], n: int, *, start: int = 0) -> None:
    """n pending runs of the bench agent in one statement: the same row
    insert_run writes (defaults for everything but agent, input, attempts),
    without the per-run round trip. No NOTIFY: workers started afterwards
    claim at once.

    created_at is the clock at each row, as when runs are submitted one by
    one, not the statement's now() shared by all n rows: with one time for
    all, the listing indexes (tenant, created_at, id) order the runs by
    their random id, so every status change put its new index entry on a
    random leaf page, which no real queue does. Measured 2026-11-30 (1 and
    2 processes, c = 50 and 200): without those two indexes the burn-down
    ran 20-38% faster with one time for all rows, 3-8% faster with a time
    per row."""
    conn.execute(
        """
        INSERT INTO runlane.runs (agent, input, max_attempts, created_at)
        SELECT %s, jsonb_build_object('i', g), 3, clock_timestamp()
        FROM generate_series(%s::bigint, %s::bigint) AS g
        """,
        (AGENT, start + 1, start + n),
    )


def enqueue(url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for start in range(0, n, 50_000):
            insert_pending(conn, min(50_000, n - start), start=start)
        conn.execute("ANALYZE runlane.runs")


def count_runs(url: str, statuses: Sequence[str]) -> int:
    return count(url, "SELECT count(*) FROM runlane.runs WHERE status = ANY(%s)", (list(statuses),))


def remaining(url: str) -> int:
    """Runs not done yet: pending or running."""
    return count_runs(url, ("pending", "running"))


def completed(url: str) -> int:
    return count_runs(url, ("completed",))


def window(url: str) -> tuple[float, float]:
    """(first claim, last finish) on the database clock, epoch seconds."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            """
            SELECT extract(epoch FROM (SELECT min(started_at) FROM runlane.runs)),
                   extract(epoch FROM (SELECT max(finished_at) FROM runlane.runs))
            """
        ).fetchone()
    assert row is not None and row[0] is not None and row[1] is not None
    return float(row[0]), float(row[1])


def steady_window(url: str, low: float, high: float) -> tuple[float, float]:
    """See bench.common.completion_marks."""
    return completion_marks(url, "finished_at", "runlane.runs", low, high)


def worker_args(
    url: str,
    concurrency: int,
    *,
    mode: str = "noop",
    extra: Sequence[str] = (),
) -> list[str]:
    return ["--url", url, "--concurrency", str(concurrency), "--mode", mode, *extra]


def spawn_worker(
    url: str,
    concurrency: int,
    *,
    mode: str = "noop",
    extra: Sequence[str] = (),
    profile: str | None = None,
    env: dict[str, str] | None = None,
    src: str | None = None,
) -> Proc:
    args = worker_args(url, concurrency, mode=mode, extra=extra)
    if profile:
        args += ["--profile", profile]
    return spawn(
        "bench.procs",
        args,
        name=f"runlane worker c={concurrency} {mode}",
        env_extra=env,
        src=src,
    )
