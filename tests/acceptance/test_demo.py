"""The built-in demo, end to end: a worker and the HTTP API in process, the
scripted runs (one submitted over HTTP with the demo key), and what they
leave in the database."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from runlane import demo
from runlane.demo import Script, run_demo
from runlane.models import RunStatus
from runlane.settings import Settings

SCRIPTED = {"greeting", "essay", "cancel-me", "flaky", "api"}
KEY_LINE = re.compile(r"demo API key \(tenant 'demo', user 'demo'; [^)]*\): (rl_\S+)")


def runs_by_label(sql: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    cur = sql.execute(
        "SELECT id, metadata->>'demo' AS label, status, attempts, output, error, "
        "last_event_seq FROM runlane.runs"
    )
    names = [c.name for c in cur.description or []]
    runs = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    by_label = {run["label"]: run for run in runs}
    assert len(by_label) == len(runs), runs
    return by_label


def events(sql: psycopg.Connection[Any], run_id: Any) -> list[tuple[int, str, Any, int]]:
    return sql.execute(
        "SELECT seq, kind, data, attempt FROM runlane.run_events WHERE run_id = %s ORDER BY seq",
        (run_id,),
    ).fetchall()


def attempts(sql: psycopg.Connection[Any], run_id: Any) -> list[tuple[int, str | None, Any]]:
    return sql.execute(
        "SELECT attempt, outcome, error FROM runlane.attempts WHERE run_id = %s ORDER BY attempt",
        (run_id,),
    ).fetchall()


def assert_ended_as_scripted(sql: psycopg.Connection[Any]) -> None:
    runs = runs_by_label(sql)
    assert set(runs) == SCRIPTED

    for label in ("greeting", "essay"):
        run = runs[label]
        assert (run["status"], run["attempts"]) == ("completed", 1), run
        assert run["output"]["resumed_from_turn"] == 0
        assert [a[1] for a in attempts(sql, run["id"])] == ["completed"]

    cancelled = runs["cancel-me"]
    assert cancelled["status"] == "cancelled", cancelled
    assert [a[1] for a in attempts(sql, cancelled["id"])] == ["cancelled"]
    # It was cancelled while streaming: some tokens, far from its 50 turns.
    assert 6 <= cancelled["last_event_seq"] < 100

    flaky = runs["flaky"]
    assert (flaky["status"], flaky["attempts"]) == ("completed", 2), flaky
    first, second = attempts(sql, flaky["id"])
    assert first[:2] == (1, "retry")
    assert "scripted failure on attempt 1" in first[2]["message"]
    assert second[:2] == (2, "completed")
    # The second attempt resumed from the checkpoint of the first.
    assert flaky["output"]["resumed_from_turn"] == 1
    turns_by_attempt: dict[int, set[int]] = {}
    for _, _, data, attempt in events(sql, flaky["id"]):
        turns_by_attempt.setdefault(attempt, set()).add(data["turn"])
    assert turns_by_attempt == {1: {1}, 2: {2, 3}}

    api = runs["api"]
    assert (api["status"], api["attempts"]) == ("completed", 1), api
    assert api["output"]["turns"] == 2

    for run in runs.values():
        stream = events(sql, run["id"])
        assert [seq for seq, *_ in stream] == list(range(1, len(stream) + 1))
        assert len(stream) == run["last_event_seq"] > 0
        assert {kind for _, kind, _, _ in stream} == {"token"}


def assert_served_over_http(sql: psycopg.Connection[Any], out: str) -> str:
    """The demo key, the request it submitted and that request's run, as
    stored; returns the API's URL the demo printed."""
    found = KEY_LINE.search(out)
    assert found, out
    key = found.group(1)
    # One demo key: stored as a hash, used, and revoked when the demo stopped.
    [(tenant, user_id, admin, key_hash, last_used, revoked)] = sql.execute(
        "SELECT tenant, user_id, admin, key_hash, last_used_at, revoked_at FROM runlane.api_keys"
    ).fetchall()
    assert (tenant, user_id, admin) == ("demo", "demo", False)
    assert key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert last_used is not None and revoked is not None

    # The 'api' run was a request in a thread of the demo key's scope.
    [(status, request_id, run_status, kind, thread_id, run_tenant, run_user)] = sql.execute(
        "SELECT q.status, q.request_id, r.status, r.kind, r.thread_id, r.tenant, r.user_id "
        "FROM runlane.requests q JOIN runlane.runs r ON r.id = q.run_id"
    ).fetchall()
    assert (status, run_status, kind) == ("dispatched", "completed", "request")
    assert (run_tenant, run_user) == ("demo", "demo") and thread_id.startswith("demo-")
    assert request_id

    # What it printed: the URL, the key and the curl commands to paste.
    url = re.search(r"HTTP API on (http://127\.0\.0\.1:\d+) ", out)
    assert url, out
    base = url.group(1)
    assert f"export KEY={key}" in out
    assert f"{base}/v1/threads/demo-1/requests" in out
    assert f'curl -sN -H "Authorization: Bearer $KEY" {base}/v1/runs/$RUN/events' in out
    assert "HTTP API check passed" in out
    return base


def test_demo_once_ends_as_scripted(
    settings: Settings, sql: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # The API's port is taken: the demo serves on a free one instead.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = run_demo(settings, once=True, timeout_seconds=60, port=port)

    out = capsys.readouterr().out
    assert code == 0, out
    assert "all 5 runs ended as scripted" in out
    # Not a terminal: one line per change instead of a live table.
    assert "cancel-me  cancelled" in out
    assert "flaky      pending" in out
    assert "api        completed" in out
    assert_ended_as_scripted(sql)
    base = assert_served_over_http(sql, out)
    assert base != f"http://127.0.0.1:{port}"


def test_demo_module_once_as_a_process(db_url: str, sql: psycopg.Connection[Any]) -> None:
    env = {**os.environ, "RUNLANE_DATABASE_URL": db_url}
    done = subprocess.run(
        [sys.executable, "-m", "runlane.demo", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "ended as scripted" in done.stdout
    assert_ended_as_scripted(sql)
    assert_served_over_http(sql, done.stdout)


def test_demo_once_fails_when_a_run_ends_otherwise(
    settings: Settings,
    sql: psycopg.Connection[Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A script expecting one attempt from a run that fails its first.
    wrong = Script(
        "wrong",
        {"text": "one two", "turns": 1, "fail_on_attempt": 1, "retry_delay": 0},
        RunStatus.COMPLETED,
        expected_attempts=1,
    )
    monkeypatch.setattr(demo, "SCRIPT", (wrong,))

    code = run_demo(settings, once=True, timeout_seconds=60)

    out = capsys.readouterr().out
    assert code == 1, out
    assert "wrong" in out and "expected completed after 1" in out
    assert sql.execute(
        "SELECT status, attempts FROM runlane.runs WHERE metadata->>'demo' = 'wrong'"
    ).fetchall() == [("completed", 2)]


def test_demo_once_fails_on_timeout(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    code = run_demo(settings, once=True, timeout_seconds=0.01)

    out = capsys.readouterr().out
    assert code == 1, out
    assert "timed out" in out
