"""The ``runlane`` command line end to end: real processes, real PostgreSQL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from runlane.embedded import EmbeddedPostgres
from runlane.migrations import available_migrations
from runlane.models import Outcome
from runlane.store import RunStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_APP = "tests.acceptance.example_app:app"
T = TypeVar("T")


def cli_env(db_url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLANE_")}
    env.update(
        RUNLANE_DATABASE_URL=db_url,
        RUNLANE_DATA_DIR=str(tmp_path / "runlane-data"),
        RUNLANE_LEASE_SECONDS="4",
        RUNLANE_HEARTBEAT_SECONDS="0.5",
        RUNLANE_POLL_SECONDS="0.2",
        RUNLANE_REAPER_INTERVAL_SECONDS="0.5",
        RUNLANE_SHUTDOWN_GRACE_SECONDS="2",
        COLUMNS="200",
    )
    env.update(extra)
    return env


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "runlane.cli", *args]


class Cli:
    """Runs ``runlane`` in a subprocess against one test database."""

    def __init__(self, db_url: str, tmp_path: Path) -> None:
        self.db_url = db_url
        self.tmp_path = tmp_path

    def env(self, **extra: str) -> dict[str, str]:
        return cli_env(self.db_url, self.tmp_path, **extra)

    def __call__(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cli_command(*args),
            env=self.env(**(env or {})),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def ok(self, *args: str, **kwargs: Any) -> str:
        result = self(*args, **kwargs)
        assert result.returncode == 0, f"runlane {args} failed: {result.stderr}"
        assert "Traceback" not in result.stderr
        return result.stdout

    def error(self, *args: str, **kwargs: Any) -> str:
        """Runs a command that must fail with one clear line on stderr."""
        result = self(*args, **kwargs)
        assert result.returncode != 0, f"runlane {args} succeeded: {result.stdout}"
        assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("error: ")
        return lines[0]

    def submit(self, agent: str, payload: Any = None, *args: str) -> str:
        out = self.ok("submit", agent, "--input", json.dumps(payload or {}), *args)
        return out.strip()

    def show(self, run_id: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.ok("runs", "show", run_id, "--json"))
        return data

    @contextmanager
    def worker(self, *args: str) -> Iterator[subprocess.Popen[str]]:
        log = (self.tmp_path / f"worker-{uuid.uuid4().hex[:6]}.log").open("w+")
        process = subprocess.Popen(
            cli_command("worker", EXAMPLE_APP, "--concurrency", "4", *args),
            env=self.env(),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            yield process
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=30)
            log.seek(0)
            output = log.read()
            assert code == 0, output
            assert "Traceback" not in output, output
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
            log.close()


@pytest.fixture
def cli(db_url: str, tmp_path: Path) -> Cli:
    return Cli(db_url, tmp_path)


def wait_for(condition: Callable[[], T], *, timeout: float = 20.0, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def status_of(sql: psycopg.Connection[Any], run_id: str) -> str:
    row = sql.execute("SELECT status FROM runlane.runs WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    return str(row[0])


# -- migrate ------------------------------------------------------------------


def test_ten_concurrent_migrations_apply_each_once(empty_db_url: str, tmp_path: Path) -> None:
    cli = Cli(empty_db_url, tmp_path)
    with ThreadPoolExecutor(max_workers=10) as pool:
        results = list(pool.map(lambda _: cli("migrate"), range(10)))
    for result in results:
        assert result.returncode == 0, result.stderr
    expected = available_migrations()
    applied_lines = [line for r in results for line in r.stdout.splitlines() if "applied" in line]
    assert len(applied_lines) == len(expected)
    with psycopg.connect(empty_db_url) as conn:
        rows = conn.execute(
            "SELECT version, count(*) FROM runlane.schema_migrations GROUP BY version"
        ).fetchall()
    assert sorted(rows) == [(m.version, 1) for m in expected]
    assert "up to date" in cli.ok("migrate")


# -- submit, worker, wait -----------------------------------------------------


def test_submit_and_wait_with_a_worker(cli: Cli, sql: psycopg.Connection[Any]) -> None:
    with cli.worker():
        done = cli("submit", "echo", "--input", '{"a": 1, "b": [2]}', "--wait", "--timeout", "60")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.strip().splitlines()
        run_id = str(uuid.UUID(lines[0]))
        assert any("key" in line and '"a"' in line for line in lines[1:])
        assert lines[-1].startswith(f"run {run_id} completed")
        assert '"echo": {"a": 1, "b": [2]}' in lines[-1]
        assert status_of(sql, run_id) == "completed"

        # --json: one JSON object per line, the ended run last.
        as_json = cli("submit", "echo", "--input", '{"k": "v"}', "--wait", "--json")
        assert as_json.returncode == 0, as_json.stderr
        items = [json.loads(line) for line in as_json.stdout.splitlines()]
        assert items[0]["type"] == "run" and items[0]["created"] is True
        assert [i["data"] for i in items if i["type"] == "event"] == [{"key": "k"}]
        assert items[-1]["status"] == "completed"
        assert items[-1]["output"] == {"echo": {"k": "v"}, "attempt": 1}
        assert "lease_token" not in items[-1]

        # A run that fails: --wait exits non-zero with the reason.
        failed = cli("submit", "fail", "--wait", "--timeout", "60")
        assert failed.returncode == 1
        failed_id = failed.stdout.splitlines()[0]
        assert "failed: bad_request" in failed.stdout

        # runs show: the attempts and the last events.
        shown = cli.show(failed_id)
        assert shown["run"]["status"] == "failed"
        assert [a["outcome"] for a in shown["attempts"]] == [Outcome.FAILED]
        assert [e["kind"] for e in shown["events"]] == ["about-to-fail"]
        human = cli.ok("runs", "show", failed_id)
        assert "bad_request" in human and "about-to-fail" in human

        # runs retry: back to pending, run again, history kept.
        retried = cli.ok("runs", "retry", failed_id)
        assert "re-queued" in retried
        wait_for(
            lambda: (
                len(cli.show(failed_id)["attempts"]) == 2 and status_of(sql, failed_id) == "failed"
            ),
            what="the re-queued run to fail again",
        )

        # Cancelling a completed run is a clear error.
        assert "already ended completed" in cli.error("runs", "cancel", run_id)


def test_cancel_reaches_a_running_handler(cli: Cli, sql: psycopg.Connection[Any]) -> None:
    with cli.worker():
        waiting = subprocess.Popen(
            cli_command("submit", "wait-for-cancel", "--wait", "--timeout", "60"),
            env=cli.env(),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            row = wait_for(
                lambda: sql.execute(
                    "SELECT id FROM runlane.runs WHERE agent = 'wait-for-cancel'"
                    " AND status = 'running'"
                ).fetchone(),
                what="the run to start",
            )
            run_id = str(row[0])
            assert "cancel requested" in cli.ok("runs", "cancel", run_id)
            out, err = waiting.communicate(timeout=30)
            assert waiting.returncode == 1, err
            assert out.splitlines()[0] == run_id
            assert f"run {run_id} cancelled" in out
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.communicate(timeout=10)
        assert status_of(sql, run_id) == "cancelled"


# -- runs (no worker) ---------------------------------------------------------


def test_runs_list_filters_and_json(cli: Cli) -> None:
    first = cli.submit("alpha", {"n": 1})
    second = cli.submit("beta", {"n": 2}, "--priority", "5", "--max-attempts", "2")
    third = cli.submit("alpha", {"n": 3}, "--delay", "3600", "--max-seconds", "30")
    cli.ok("runs", "cancel", third)

    listed = json.loads(cli.ok("runs", "list", "--json"))
    assert [r["id"] for r in listed] == [third, second, first]
    assert listed[1]["priority"] == 5 and listed[1]["max_attempts"] == 2
    assert listed[0]["budget"] == {"max_seconds": 30}

    pending_alpha = json.loads(
        cli.ok("runs", "list", "--agent", "alpha", "--status", "pending", "--json")
    )
    assert [r["id"] for r in pending_alpha] == [first]
    several = json.loads(
        cli.ok("runs", "list", "-s", "pending", "-s", "cancelled", "--limit", "2", "--json")
    )
    assert [r["id"] for r in several] == [third, second]

    table = cli.ok("runs", "list")
    assert first in table and "cancelled" in table and "beta" in table


def test_cancel_a_pending_run(cli: Cli, sql: psycopg.Connection[Any]) -> None:
    run_id = cli.submit("echo", {"x": 1})
    assert status_of(sql, run_id) == "pending"
    out = cli.ok("runs", "cancel", run_id)
    assert "cancelled" in out
    assert status_of(sql, run_id) == "cancelled"
    # Cancelling again is harmless.
    assert json.loads(cli.ok("runs", "cancel", run_id, "--json"))["status"] == "cancelled"


def test_idempotency_key_returns_the_same_run(cli: Cli) -> None:
    first = cli.submit("echo", {"x": 1}, "--idempotency-key", "order-42")
    again = cli("submit", "echo", "--input", '{"x": 2}', "--idempotency-key", "order-42")
    assert again.returncode == 0
    assert again.stdout.strip() == first
    assert "existing run" in again.stderr


def test_input_from_stdin(cli: Cli) -> None:
    result = subprocess.run(
        cli_command("submit", "echo", "--input", "-", "--json"),
        input='{"from": "stdin"}',
        env=cli.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["input"] == {"from": "stdin"}


# -- errors: one line, non-zero, no traceback ---------------------------------


async def test_cancel_of_a_completed_run_is_an_error(cli: Cli, store: RunStore) -> None:
    run_id = cli.submit("echo", {})
    [claimed] = await store.claim_batch(worker_id="test", limit=1, lease_seconds=30)
    await store.finish_attempt(claimed.id, claimed.lease_token, Outcome.COMPLETED, output={})
    line = cli.error("runs", "cancel", run_id)
    assert line == f"error: run {run_id} already ended completed"
    assert "only failed or dead" in cli.error("runs", "retry", run_id)


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["submit", "echo", "--input", "{not json"], {}, "--input is not valid JSON"),
        (["submit", "echo", "--input", "NaN"], {}, "input: numbers must be finite"),
        (["submit", "no agent!", "--input", "{}"], {}, "agent must be"),
        (["submit", "echo", "--priority", "5000"], {}, "priority must be between"),
        (["submit", "echo", "--max-seconds", "-1"], {}, "max_seconds must be a number"),
        (
            ["submit", "echo", "--input", json.dumps({"text": "x" * 100})],
            {"RUNLANE_MAX_INPUT_BYTES": "32"},
            "the limit is 32",
        ),
        (["runs", "show", str(uuid.uuid4())], {}, "no run"),
        (["runs", "show", "not-a-uuid"], {}, "no run 'not-a-uuid'"),
        (["runs", "cancel", "12345"], {}, "no run '12345'"),
        (["runs", "retry", str(uuid.uuid4())], {}, "no run"),
        (["runs", "list", "--limit", "0"], {}, "limit must be between"),
        (["runs", "list"], {"RUNLANE_LEASE_SECONDS": "-1"}, "RUNLANE_LEASE_SECONDS"),
        (["runs", "list"], {"RUNLANE_HEARTBEAT_SECONDS": "3"}, "invalid settings"),
        (
            ["runs", "list"],
            {"RUNLANE_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nowhere"},
            "cannot reach the database",
        ),
        (["worker", "no_such_module:app"], {}, "cannot import 'no_such_module'"),
        (["worker", "tests.acceptance.example_app:nope"], {}, "has no attribute 'nope'"),
        (["worker", "tests.acceptance.example_app"], {}, "expected MODULE:APP"),
        (["worker", "tests.acceptance.example_app:asyncio"], {}, "not a runlane.App"),
        (["worker", EXAMPLE_APP, "--agents", "echo,ghost"], {}, "'ghost'"),
        (["worker", EXAMPLE_APP], {"RUNLANE_GC_THRESHOLD": "-1"}, "RUNLANE_GC_THRESHOLD"),
        (
            ["worker", EXAMPLE_APP],
            {"RUNLANE_PREFETCH_HANDLER_SECONDS": "soon"},
            "RUNLANE_PREFETCH_HANDLER_SECONDS",
        ),
        (["db", "start"], {}, "RUNLANE_DATABASE_URL is set"),
    ],
)
def test_bad_input_is_one_clear_line(
    cli: Cli, args: list[str], env: dict[str, str], expected: str
) -> None:
    assert expected in cli.error(*args, env=env)


def test_db_url_prints_the_configured_url(cli: Cli) -> None:
    assert cli.ok("db", "url").strip() == cli.db_url


def test_db_start_url_stop_manage_the_embedded_server() -> None:
    # Not under pytest's tmp_path (mode 0700, and reset by any other pytest
    # session): as root the server runs as another user who must reach it.
    base = Path(tempfile.mkdtemp(prefix="runlane-cli-db-"))
    base.chmod(0o755)
    data_dir = base / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLANE_")}
    env["RUNLANE_DATA_DIR"] = str(data_dir)

    def run(*args: str) -> str:
        result = subprocess.run(
            cli_command(*args), env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    try:
        assert "running" in run("db", "start")
        url = run("db", "url")
        assert str(data_dir / "pgdata") in url
        # The next command finds the same server, with the schema in place.
        run_id = run("submit", "echo")
        assert [r["id"] for r in json.loads(run("runs", "list", "--json"))] == [run_id]
        assert run("db", "stop") == "embedded PostgreSQL stopped"
        assert run("db", "stop") == "embedded PostgreSQL was not running"
    finally:
        EmbeddedPostgres(data_dir / "pgdata").stop(mode="immediate")
        shutil.rmtree(base, ignore_errors=True)
