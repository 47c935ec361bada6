"""Shared fixtures: a real PostgreSQL, and a fresh database per test cloned
from a migrated template.

With ``RUNLANE_TEST_DATABASE_URL`` set, databases are created on that server;
otherwise the suite starts its own embedded PostgreSQL under a temporary
directory.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo as pg_conninfo

from runlane.database import create_pool
from runlane.lane_service import LaneService
from runlane.lane_store import LaneStore
from runlane.migrations import migrate
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import RunStore
from tests.support import embedded_test_server

TEMPLATE_NAME = f"runlane_test_template_{os.getpid()}"


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, in the top conftest, so that pytest registers it for every way
    # the suite is started. Read by tests/faults/conftest.py.
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="run the fault tests at their large sizes (minutes to an hour)",
    )


def database_url(server_url: str, dbname: str) -> str:
    params = pg_conninfo.conninfo_to_dict(server_url)
    params["dbname"] = dbname
    return pg_conninfo.make_conninfo(**params)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """Admin URL of the server the tests use."""
    external = os.environ.get("RUNLANE_TEST_DATABASE_URL")
    if external:
        yield external
        return
    with embedded_test_server() as server:
        yield server.url()


@pytest.fixture(scope="session")
def template_db(pg_server_url: str) -> Iterator[str]:
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_NAME}"')
        conn.execute(f'CREATE DATABASE "{TEMPLATE_NAME}"')
    migrate(database_url(pg_server_url, TEMPLATE_NAME))
    try:
        yield TEMPLATE_NAME
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_NAME}" WITH (FORCE)')


@pytest.fixture
def db_url(pg_server_url: str, template_db: str) -> Iterator[str]:
    """URL of a fresh, migrated database for this test alone."""
    name = f"runlane_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}" STRATEGY FILE_COPY')
    try:
        yield database_url(pg_server_url, name)
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def empty_db_url(pg_server_url: str) -> Iterator[str]:
    """URL of a fresh database with no schema at all."""
    name = f"runlane_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield database_url(pg_server_url, name)
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def settings(db_url: str) -> Settings:
    """Short leases so that expiry-driven tests finish quickly."""
    return Settings(
        database_url=db_url,
        lease_seconds=4.0,
        heartbeat_seconds=0.5,
        poll_seconds=0.2,
        reaper_interval_seconds=0.5,
        shutdown_grace_seconds=2.0,
        cancel_grace_seconds=5.0,
        data_dir=Path("/nonexistent-runlane-test-data"),
    )


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[RunStore]:
    pool = create_pool(db_url, min_size=1, max_size=10)
    await pool.open()
    try:
        yield RunStore(pool)
    finally:
        await pool.close()


@pytest.fixture
def service(store: RunStore, settings: Settings) -> RunService:
    return RunService(store, settings)


@pytest.fixture
def lanes(store: RunStore, service: RunService) -> LaneService:
    return LaneService(LaneStore(store.pool), service)


@pytest.fixture
def sql(db_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain autocommit connection for checking what is stored."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn
