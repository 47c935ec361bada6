"""Helpers shared by the tests: waiting on conditions, running workers."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from runlane.app import App
from runlane.embedded import EmbeddedPostgres
from runlane.models import ClaimedRun, Run
from runlane.settings import Settings
from runlane.worker import Worker

T = TypeVar("T")


async def wait_until(
    condition: Callable[[], Awaitable[T] | T],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    message: str = "condition",
) -> T:
    """Polls ``condition`` until it returns something truthy; returns it."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        await asyncio.sleep(interval)


@asynccontextmanager
async def running_worker(app: App, settings: Settings, **kwargs: Any) -> AsyncIterator[Worker]:
    assert settings.database_url is not None
    worker = Worker(app, settings.database_url, settings=settings, **kwargs)
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop(grace_seconds=1.0)


def run_status(conn: psycopg.Connection[Any], run_id: Any) -> str:
    row = conn.execute("SELECT status FROM runlane.runs WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    return str(row[0])


@contextmanager
def embedded_test_server() -> Iterator[EmbeddedPostgres]:
    """A throw-away embedded PostgreSQL. Not under pytest's tmp_path: as
    root the server runs as another user, who must reach its directory."""
    base = Path(tempfile.mkdtemp(prefix="runlane-test-pg-"))
    base.chmod(0o755)
    server = EmbeddedPostgres(base / "pgdata")
    server.start()
    try:
        yield server
    finally:
        server.stop(mode="immediate")
        shutil.rmtree(base, ignore_errors=True)


def claimed_as_stored(claimed: ClaimedRun, stored: Run | None) -> dict[str, tuple[Any, Any]]:
    """The fields where a claimed run differs from the run as stored
    (empty when it is the same run, as the claim left it)."""
    assert stored is not None, "the claimed run is not stored"
    differ = {}
    for field in fields(ClaimedRun):
        if field.name in ("deadline_in_seconds", "pushed"):
            continue
        mine, theirs = getattr(claimed, field.name), getattr(stored, field.name)
        if mine != theirs or type(mine) is not type(theirs):
            differ[field.name] = (mine, theirs)
    return differ
