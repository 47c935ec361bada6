"""SIGTERM: the worker stops claiming, releases runs at their safe point,
stops the rest after the grace period and releases them too."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from runlane.models import RunStatus
from runlane.service import RunService
from tests.support import wait_until


def start_worker(db_url: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.faults.fault_app"],
            env={
                **os.environ,
                "RUNLANE_DATABASE_URL": db_url,
                "RUNLANE_LEASE_SECONDS": "10",
                "RUNLANE_HEARTBEAT_SECONDS": "1",
                "RUNLANE_POLL_SECONDS": "0.2",
                **env,
            },
            stderr=stderr,
        )


async def test_sigterm_releases_every_lease(
    db_url: str, service: RunService, sql: psycopg.Connection[Any], tmp_path: Path
) -> None:
    safe, _ = await service.submit("safe", {"step_seconds": 0.05}, max_attempts=3)
    stubborn, _ = await service.submit("stubborn", {}, max_attempts=3)
    worker = start_worker(db_url, tmp_path / "w1.log", RUNLANE_SHUTDOWN_GRACE_SECONDS="1")
    try:
        await wait_until(
            lambda: sql.execute(
                "SELECT count(*) = 2 FROM runlane.runs WHERE status = 'running'"
                " AND last_event_seq > 0"
            ).fetchone()[0],  # type: ignore[index]
            timeout=30,
            message="both runs working",
        )
        sent = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(worker.wait, 30)
        elapsed = time.monotonic() - sent
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
    assert code == 0
    assert elapsed < 10  # within the grace period plus the release, not a lease expiry

    for run, how in ((safe, "worker shut down at a safe point"), (stubborn, "grace period over")):
        after = await service.get(run.id)
        assert after.status is RunStatus.PENDING and after.lease_token is None
        assert after.attempts == 1
        attempts = await service.attempts(run.id)
        assert [a.outcome for a in attempts] == ["released"]
        assert how in (attempts[0].error or {}).get("message", "")
    assert sql.execute(
        "SELECT count(*) FROM runlane.runs WHERE status IN ('running', 'cancel_requested')"
    ).fetchone() == (0,)

    # Another worker picks the released runs up at once.
    second = start_worker(db_url, tmp_path / "w2.log")
    try:
        await wait_until(
            lambda: sql.execute(
                "SELECT count(*) = 2 FROM runlane.runs WHERE status = 'running' AND attempts = 2"
            ).fetchone()[0],  # type: ignore[index]
            timeout=30,
            message="released runs claimed again",
        )
    finally:
        second.kill()
        second.wait()


async def test_sigterm_lets_a_run_that_finishes_within_the_grace_complete(
    db_url: str, service: RunService, sql: psycopg.Connection[Any], tmp_path: Path
) -> None:
    run, _ = await service.submit("safe", {"steps": 1, "step_seconds": 2.0})
    worker = start_worker(db_url, tmp_path / "w.log", RUNLANE_SHUTDOWN_GRACE_SECONDS="10")
    try:
        await wait_until(
            lambda: sql.execute("SELECT last_event_seq > 0 FROM runlane.runs").fetchone()[0],  # type: ignore[index]
            timeout=30,
            message="run started",
        )
        worker.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(worker.wait, 30)
    finally:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
    assert code == 0
    done = await service.get(run.id)
    assert done.status is RunStatus.COMPLETED and done.attempts == 1
