"""Versioned schema migrations, applied once each under an advisory lock."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg

# Any constant shared by every runlane process; "runlane" in ASCII.
MIGRATION_LOCK_KEY = 0x72756E6C616E65

_FILE_NAME = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def available_migrations(up_to: int | None = None) -> list[Migration]:
    """The packaged migrations in order (those up to version ``up_to``,
    when given: an upgrade's tests start from an older schema)."""
    folder = resources.files("runlane").joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration versions: {versions}")
    return [m for m in found if up_to is None or m.version <= up_to]


def migrate(conninfo: str, *, up_to: int | None = None) -> list[Migration]:
    """Applies every missing migration (up to version ``up_to``, when
    given); returns those this call applied.

    A session-level advisory lock serialises concurrent callers, so ten
    processes starting at once apply each migration exactly once.
    """
    # Read-only first: an up-to-date schema needs no lock and no DDL rights,
    # so a least-privilege application role can start every command.
    if not pending_migrations(conninfo, up_to=up_to):
        return []
    applied_now: list[Migration] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            conn.execute("CREATE SCHEMA IF NOT EXISTS runlane")
            conn.execute(
                """
                CREATE TABLE IF NOT EXISTS runlane.schema_migrations (
                    version    integer PRIMARY KEY,
                    name       text NOT NULL,
                    applied_at timestamptz NOT NULL DEFAULT now()
                )
                """
            )
            done = {row[0] for row in conn.execute("SELECT version FROM runlane.schema_migrations")}
            for migration in available_migrations(up_to):
                if migration.version in done:
                    continue
                with conn.transaction():
                    conn.execute(migration.sql.encode())
                    conn.execute(
                        "INSERT INTO runlane.schema_migrations (version, name) VALUES (%s, %s)",
                        (migration.version, migration.name),
                    )
                applied_now.append(migration)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return applied_now


def pending_migrations(conninfo: str, *, up_to: int | None = None) -> list[Migration]:
    """Migrations not yet applied (all of them on an empty database), up to
    version ``up_to`` when given."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT to_regclass('runlane.schema_migrations') IS NOT NULL"
        ).fetchone()
        done: set[int] = set()
        if exists and exists[0]:
            done = {row[0] for row in conn.execute("SELECT version FROM runlane.schema_migrations")}
    return [m for m in available_migrations(up_to) if m.version not in done]
