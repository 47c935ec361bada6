"""Where the database is, and connections to it."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
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


async def _configure(conn: AsyncConnection[DictRow]) -> None:
    # Autocommit by default: every store call is one statement or opens an
    # explicit short transaction.
    await conn.set_autocommit(True)


def create_pool(
    url: str, *, min_size: int = 1, max_size: int = 10, check: bool = True
) -> AsyncConnectionPool[AsyncConnection[DictRow]]:
    """A connection pool (not yet opened) whose rows are dicts.

    With ``check`` each checkout first tests the connection, so that a
    connection broken while idle (a server restart) is replaced instead of
    failing a caller's request. The worker turns it off: it retries every
    transient error itself, and the check would cost a round trip per
    statement on its hot path."""
    return AsyncConnectionPool(
        url,
        min_size=min_size,
        max_size=max_size,
        open=False,
        kwargs={"row_factory": dict_row, **CONNECT_OPTIONS},
        configure=_configure,
        check=AsyncConnectionPool.check_connection if check else None,
        connection_class=AsyncConnection[DictRow],
    )
