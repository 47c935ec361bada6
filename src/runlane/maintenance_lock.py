"""The advisory lock that makes one process at a time do a maintenance job
(reap expired leases, recover lanes, prune), and that a frozen holder
cannot keep.

Each job runs in every worker; the lock only saves duplicate work (every
job's statements are safe to run concurrently). What it must never do is
stall a job: a worker paused in the middle of a pass (a GC pause, a frozen
VM, SIGSTOP, a black-holed connection) would hold a plain session lock for
as long as the pause, and nobody would reap its own expired leases. So the
holder's session gets a bounded idle time for the length of the pass: the
server disconnects a holder that stops talking, and the lock goes with the
session.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from psycopg import AsyncConnection
from psycopg.rows import DictRow

from runlane.queries import named_queries

# Longer than any pause between two statements of a healthy pass (they
# follow each other in microseconds), short against a lease.
IDLE_SECONDS = 5.0


@asynccontextmanager
async def maintenance_lock(
    conn: AsyncConnection[DictRow], lock_key: int, *, idle_seconds: float = IDLE_SECONDS
) -> AsyncIterator[bool]:
    """Yields whether this connection got ``lock_key`` (False: another
    process does the job now). ``conn`` must be in autocommit mode."""
    sql = named_queries("maintenance.sql")
    idle_ms = str(max(1, round(idle_seconds * 1000)))
    try:
        cur = await conn.execute(sql["try_lock"], {"lock_key": lock_key, "idle_ms": idle_ms})
        row = await cur.fetchone()
    except BaseException:
        # Cancelled or failed half way: whether the server took the lock is
        # unknown. Ending the session frees it; the pool drops a closed
        # connection instead of lending one that may hold the lock.
        await conn.close()
        raise
    locked = bool(row and row["locked"])
    try:
        yield locked
    finally:
        if locked:
            await conn.execute(sql["unlock"], {"lock_key": lock_key})
