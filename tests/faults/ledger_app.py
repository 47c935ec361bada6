"""The "ledger" agent of the fault tests, served by
``python -m tests.faults.ledger_app`` (one worker process).

Every attempt writes fenced rows through its RunContext (a checkpoint,
events via ``ctx.emit``, effects via ``ctx.once``; heartbeats happen anyway)
and, beside them, rows in an *unfenced* ledger (``faults.ledger``,
``faults.effect_calls``) over its own connection, so that every execution
is counted, including those whose fenced writes were refused or never
happened. Ledger times are the worker's wall clock at the moment the
handler started, ended or called the effect: the database's clock too
when both run on one host, as in the tests (which check that they
agree). Each fenced write carries the attempt's lease token and pid, so a
test can tell which execution wrote it.

``create_ledger(conn)`` creates the ledger tables (and a trigger logging the
last lease expiry granted to each attempt) in a test database.

Input: ``steps`` (default 3) steps, each a safe point, an event, an effect
and ``step_seconds`` of sleep; ``tool_seconds`` of sleep without a safe
point before the steps (a tool call); ``fail_attempts``: the first that many
attempts raise (retried with backoff), or every attempt with ``-1``;
``blocking_seconds``: the first attempt waits ``block_after_seconds``,
emits "blocking", creates the file ``blocking_marker`` (if given), blocks
the whole process (``time.sleep``) and returns.

Environment: RUNLANE_* settings, LEDGER_CONCURRENCY (default 6),
LEDGER_LOG_LEVEL (default INFO).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import DictRow

from runlane import App, RunContext
from runlane.database import create_pool
from runlane.settings import Settings
from runlane.worker import Worker

app = App()

_pool: Any = None

LEDGER_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS faults;
-- One row per execution of the handler (attempt), written without fencing.
CREATE TABLE IF NOT EXISTS faults.ledger (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      uuid        NOT NULL,
    attempt     integer     NOT NULL,
    lease_token uuid        NOT NULL,
    pid         integer     NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at    timestamptz,
    how         text
);
CREATE INDEX IF NOT EXISTS ledger_run_idx ON faults.ledger (run_id);
-- One row per execution of an effect passed to ctx.once (before its record).
CREATE TABLE IF NOT EXISTS faults.effect_calls (
    run_id      uuid        NOT NULL,
    key         text        NOT NULL,
    lease_token uuid        NOT NULL,
    pid         integer     NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- The last lease expiry the database granted to each attempt (claim, or
-- the insert of a run pushed to a parked worker, and every renewal), kept
-- by a trigger: runlane itself keeps only the current one.
CREATE TABLE IF NOT EXISTS faults.lease_log (
    lease_token     uuid PRIMARY KEY,
    run_id          uuid        NOT NULL,
    last_expires_at timestamptz NOT NULL,
    grants          integer     NOT NULL DEFAULT 1
);
CREATE OR REPLACE FUNCTION faults.log_lease() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO faults.lease_log (lease_token, run_id, last_expires_at)
    VALUES (NEW.lease_token, NEW.id, NEW.lease_expires_at)
    ON CONFLICT (lease_token) DO UPDATE
    SET last_expires_at = greatest(faults.lease_log.last_expires_at, excluded.last_expires_at),
        grants = faults.lease_log.grants + 1;
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS runs_log_lease ON runlane.runs;
CREATE TRIGGER runs_log_lease
    AFTER INSERT OR UPDATE OF lease_expires_at ON runlane.runs
    FOR EACH ROW
    WHEN (NEW.lease_token IS NOT NULL AND NEW.lease_expires_at IS NOT NULL)
    EXECUTE FUNCTION faults.log_lease();
"""


def worker_env(*, lease_seconds: float, concurrency: int) -> dict[str, str]:
    """The settings of the fault tests' worker processes: short leases, a
    busy reaper, no priority aging (so claims follow submission order)."""
    return {
        "RUNLANE_LEASE_SECONDS": str(lease_seconds),
        "RUNLANE_HEARTBEAT_SECONDS": "0.5",
        "RUNLANE_POLL_SECONDS": "0.2",
        "RUNLANE_REAPER_INTERVAL_SECONDS": "0.3",
        "RUNLANE_PRIORITY_AGING_SECONDS": "0",
        "LEDGER_CONCURRENCY": str(concurrency),
    }


def create_ledger(conn: psycopg.Connection[Any]) -> None:
    """Creates the ledger tables and the lease-log trigger (idempotent)."""
    conn.execute(LEDGER_SCHEMA)


def scale_backoff(sql: psycopg.Connection[Any], scale: float) -> None:
    """Replaces runlane.backoff_seconds in the test database with the same
    curve (5 s doubling, capped at 300 s, +/-10% jitter) times ``scale``."""
    if scale == 1.0:
        return
    sql.execute(
        f"""
        CREATE OR REPLACE FUNCTION runlane.backoff_seconds(attempts integer)
        RETURNS double precision LANGUAGE sql VOLATILE AS $$
            SELECT {float(scale)} * least(300.0, 5.0 * power(2.0, greatest(attempts - 1, 0)))
                   * (0.9 + 0.2 * random())
        $$"""
    )


async def _unfenced(query: str, params: tuple[Any, ...]) -> Any:
    """One unfenced statement on the ledger's own pool; returns its first row."""
    assert _pool is not None
    conn: AsyncConnection[DictRow]
    async with _pool.connection() as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchone() if cur.description else None


@app.agent("ledger")
async def ledger(ctx: RunContext) -> Any:
    started = time.time()
    pid = os.getpid()
    token = str(ctx.lease_token)
    row = await _unfenced(
        "INSERT INTO faults.ledger (run_id, attempt, lease_token, pid, started_at)"
        " VALUES (%s, %s, %s, %s, to_timestamp(%s)) RETURNING id",
        (ctx.run_id, ctx.attempt, ctx.lease_token, pid, started),
    )
    how = "returned"
    try:
        mark = {"attempt": ctx.attempt, "lease_token": token, "pid": pid}
        await ctx.save_checkpoint(mark)
        fail_attempts = int(ctx.input.get("fail_attempts", 0))
        if fail_attempts < 0 or ctx.attempt <= fail_attempts:
            raise RuntimeError(f"ledger: attempt {ctx.attempt} fails on purpose")
        blocking_seconds = float(ctx.input.get("blocking_seconds", 0))
        if blocking_seconds and ctx.attempt == 1:
            await asyncio.sleep(float(ctx.input.get("block_after_seconds", 0)))
            await ctx.emit("blocking", mark)
            # A badly behaved synchronous tool call: the whole event loop
            # (heartbeats and watchdog included) stops, then the run returns.
            # The marker file says, with no await in between, that it began.
            marker = ctx.input.get("blocking_marker")
            if marker:
                Path(marker).write_text(str(os.getpid()))  # noqa: ASYNC240
            time.sleep(blocking_seconds)  # noqa: ASYNC251
            return mark
        tool_seconds = float(ctx.input.get("tool_seconds", 0))
        if tool_seconds:
            await ctx.emit("tool", mark)
            await asyncio.sleep(tool_seconds)  # no safe point: only a stop ends this early
        step_seconds = float(ctx.input.get("step_seconds", 0.02))
        for step in range(int(ctx.input.get("steps", 3))):
            await ctx.safe_point()
            await ctx.emit("step", {**mark, "step": step})

            async def effect(key: str = f"effect-{step}") -> dict[str, Any]:
                await _unfenced(
                    "INSERT INTO faults.effect_calls (run_id, key, lease_token, pid, at)"
                    " VALUES (%s, %s, %s, %s, to_timestamp(%s))",
                    (ctx.run_id, key, ctx.lease_token, pid, time.time()),
                )
                return mark

            await ctx.once(f"effect-{step}", effect)
            await asyncio.sleep(step_seconds)
        return mark
    except BaseException as exc:
        how = type(exc).__name__
        raise
    finally:
        # Not awaited: the handler ends now (a return is not delayed by a
        # round trip, a cancellation is not swallowed); the row, stamped
        # with this moment, closes a little later unless the process dies.
        _close_ledger_row(row["id"], how, time.time())


_closing: set[asyncio.Task[None]] = set()


def _close_ledger_row(row_id: int, how: str, ended: float) -> None:
    async def close() -> None:
        try:
            await _unfenced(
                "UPDATE faults.ledger SET ended_at = to_timestamp(%s), how = %s WHERE id = %s",
                (ended, how, row_id),
            )
        except Exception as exc:
            # A test waiting for this row to close then times out: the
            # worker's log says why.
            logging.getLogger(__name__).warning("ledger row %s not closed: %r", row_id, exc)

    task = asyncio.create_task(close())
    _closing.add(task)
    task.add_done_callback(_closing.discard)


async def serve() -> None:
    global _pool
    settings = Settings()
    assert settings.database_url is not None
    concurrency = int(os.environ.get("LEDGER_CONCURRENCY", "6"))
    _pool = create_pool(settings.database_url, min_size=1, max_size=2)
    await _pool.open(wait=False)
    worker = Worker(app, settings.database_url, settings=settings, concurrency=concurrency)
    try:
        await worker.run_until_signalled()
    finally:
        if _closing:
            await asyncio.wait(_closing, timeout=5)
        await _pool.close()


def start_worker(db_url: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """Starts ``python -m tests.faults.ledger_app`` with its stderr in ``log``;
    ``env`` adds or overrides environment variables (RUNLANE_*, LEDGER_*)."""
    with log.open("ab") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.faults.ledger_app"],
            cwd=Path(__file__).resolve().parents[2],
            env={**os.environ, "RUNLANE_DATABASE_URL": db_url, **env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("LEDGER_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format=f"%(asctime)s {os.getpid()} %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(serve())


if __name__ == "__main__":
    main()
