"""Where the database is, and connections to it."""

from __future__ import annotations

import json
import select
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from psycopg import AsyncConnection, OperationalError
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.pq import ConnStatus
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from runlane.embedded import EmbeddedPostgres
from runlane.migrations import migrate
from runlane.settings import Settings


def embedded_server(settings: Settings) -> EmbeddedPostgres:
    return EmbeddedPostgres(settings.data_dir / "pgdata")


def resolve_database_url(settings: Settings, *, apply_migrations: bool = True) -> str:
    """The configured URL, or the embedded server's (started on demand).

    Applies pending migrations unless told not to: every command that needs
    the schema brings it up to date on start-up.
    """
    url = settings.database_url or embedded_server(settings).start()
    if apply_migrations:
        migrate(url)
    return url


# Bounded connects, and TCP keepalives so a dead peer is noticed in seconds
# rather than hours (ignored on Unix sockets).
CONNECT_OPTIONS: dict[str, Any] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 3,
    "keepalives_count": 3,
    # Unacknowledged writes fail after 10 s instead of hanging on a dead peer.
    "tcp_user_timeout": 10_000,
}


def jsonb_param(value: Any, encoded: bytes | None = None) -> Jsonb:
    """``value`` as a jsonb parameter. ``encoded``, when given, is its JSON
    already made and encoded to UTF-8 (a submit's size check does that):
    psycopg sends it instead of serializing the value again: half the
    serialization's time, 1.6-1.7 ms instead of 3.2-3.4 for an agent's
    transcript of 139 kB (BENCHMARKS.md, *Where the time goes*,
    thirty-seventh session)."""
    if encoded is None:
        return Jsonb(value)
    return Jsonb(value, dumps=lambda _value: encoded)


class JsonbLoader(Loader):
    """jsonb values as psycopg's own loader reads them, for less work per
    value. A claimed run carries three (input, budget, metadata): with
    psycopg's loader, loading a claimed run's row took 8.7 us of the 13.8
    the worker spent turning it into a Run; with this one, 4.6
    (2026-11-30, 200-row batches).

    The empty object, the commonest value (budget and metadata by default),
    is built without parsing (a new dict each time: handlers may change
    it). Other values are decoded before json.loads, which would otherwise
    first guess the encoding of the bytes; the decoding is the one it
    would choose for PostgreSQL's text (UTF-8, surrogates passed)."""

    def load(self, data: Buffer) -> Any:
        text = bytes(data)
        if text == b"{}":
            return {}
        return json.loads(text.decode("utf-8", "surrogatepass"))


async def _configure(conn: AsyncConnection[DictRow]) -> None:
    await _configure_adapters(conn)
    await conn.execute(SESSION_SETTINGS)


async def _configure_in_utc(conn: AsyncConnection[DictRow]) -> None:
    await _configure_adapters(conn)
    # psycopg gives times of a session in UTC a fixed offset; in any other
    # zone (Etc/UTC included) it converts each through zoneinfo: 1.5 us of
    # the worker's CPU per claimed run, whose row has five times (twenty-
    # third session). PgBouncer keeps a client's TimeZone across servers.
    await conn.execute(SESSION_SETTINGS_IN_UTC)


async def _configure_adapters(conn: AsyncConnection[DictRow]) -> None:
    # Autocommit by default: every store call is one statement or opens an
    # explicit short transaction (and the settings below open none).
    await conn.set_autocommit(True)
    conn.adapters.register_loader("jsonb", JsonbLoader)


# No JIT compilation in runlane's sessions: its statements read a page or a
# batch through indexes, yet a plan whose estimated cost passes
# jit_above_cost (an operator's listing over a long history, estimated from
# every row) was compiled at every call, prepared or not: 20-24 ms of
# compiling for 0.3 ms of work (a page of failed runs among 320,000 runs,
# thirty-fourth session, BENCHMARKS.md section 4). The SQL functions of the
# hot path set jit = off themselves; this covers the plain statements.
SESSION_SETTINGS = "SELECT set_config('jit', 'off', false)"
SESSION_SETTINGS_IN_UTC = (
    "SELECT set_config('jit', 'off', false), set_config('TimeZone', 'UTC', false)"
)


async def check_without_round_trip(conn: AsyncConnection[DictRow]) -> None:
    """A checkout check that costs no round trip in the common case. A
    healthy idle connection has nothing to read; one the server closed while
    it sat idle (a restart, an idle timeout, a killed backend) has the
    server's last message or EOF waiting on its socket. Only then is the
    connection tested for real (which fails, so the pool replaces it). A peer
    that vanished without closing is caught by the TCP keepalives and
    timeouts of ``CONNECT_OPTIONS`` instead."""
    if conn.closed or conn.pgconn.status != ConnStatus.OK:
        raise OperationalError("the connection is closed")
    if _readable(conn.pgconn.socket):
        await AsyncConnectionPool.check_connection(conn)


def _readable(fd: int) -> bool:
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])


def create_pool(
    url: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    check: bool | Literal["quiet"] = True,
    in_utc: bool = False,
) -> AsyncConnectionPool[AsyncConnection[DictRow]]:
    """A connection pool (not yet opened) whose rows are dicts.

    With ``in_utc`` its sessions' time zone is UTC, so that the times it
    reads are datetimes in UTC (the worker's pool: the same instants,
    cheaper to load); otherwise the server's time zone applies.

    With ``check`` each checkout first tests the connection, so that a
    connection broken while idle (a server restart) is replaced instead of
    failing a caller's request; ``"quiet"`` does so without a round trip
    (``check_without_round_trip``; the API's pool). The worker turns it off:
    it retries every transient error itself."""
    checker: Callable[[AsyncConnection[DictRow]], Awaitable[None]] | None = None
    if check == "quiet":
        checker = check_without_round_trip
    elif check:
        checker = AsyncConnectionPool.check_connection
    return AsyncConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        open=False,
        kwargs={"row_factory": dict_row, **CONNECT_OPTIONS},
        configure=_configure_in_utc if in_utc else _configure,
        check=checker,
        connection_class=AsyncConnection[DictRow],
    )
