"""The maintenance lock: one holder at a time, and a holder that stops
talking to the server mid-pass loses it (tests/faults/test_paused_owner.py
shows the same with a SIGSTOPped worker)."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row

from runlane.maintenance_lock import maintenance_lock
from tests.support import wait_until

KEY = 0x726C5F746573


async def connect(db_url: str) -> AsyncConnection[DictRow]:
    return await AsyncConnection.connect(db_url, autocommit=True, row_factory=dict_row)


def lock_free(db_url: str) -> bool:
    with psycopg.connect(db_url, autocommit=True) as other:
        row = other.execute("SELECT pg_try_advisory_lock(%s)", (KEY,)).fetchone()
        return bool(row and row[0])


async def idle_timeouts(conn: AsyncConnection[DictRow]) -> tuple[str, str]:
    cur = await conn.execute(
        "SELECT current_setting('idle_session_timeout') AS s,"
        " current_setting('idle_in_transaction_session_timeout') AS t"
    )
    row = await cur.fetchone()
    assert row is not None
    return row["s"], row["t"]


async def test_one_holder_at_a_time_and_the_session_is_given_back_as_it_was(
    db_url: str,
) -> None:
    first, second = await connect(db_url), await connect(db_url)
    try:
        before = await idle_timeouts(first)
        async with maintenance_lock(first, KEY, idle_seconds=30) as locked:
            assert locked
            assert await idle_timeouts(first) == ("30s", "30s")
            async with maintenance_lock(second, KEY) as also:
                assert not also
            # The loser's session is not bounded.
            assert await idle_timeouts(second) == before
        assert await idle_timeouts(first) == before
        async with maintenance_lock(second, KEY) as locked:
            assert locked
    finally:
        await first.close()
        await second.close()


async def test_a_holder_that_stops_talking_loses_the_lock(db_url: str) -> None:
    holder = await connect(db_url)
    try:
        # The unlock at the end fails: the server ended the holder's session.
        with pytest.raises(psycopg.OperationalError):
            async with maintenance_lock(holder, KEY, idle_seconds=0.5) as locked:
                assert locked
                assert not lock_free(db_url)
                # The holder now says nothing (as a paused process would):
                # the server ends its session, and the lock is free again.
                await wait_until(lambda: lock_free(db_url), timeout=20, message="lock released")
    finally:
        await holder.close()
