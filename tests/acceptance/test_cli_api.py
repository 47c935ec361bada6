"""``runlane serve`` and ``runlane keys ...`` end to end: real processes, real
HTTP, real PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from runlane.cli_api import GRACEFUL_SHUTDOWN_SECONDS
from tests.acceptance.test_cli import ROOT, Cli, cli_command, wait_for
from tests.api_support import free_port

KEY = re.compile(r"^rl_[0-9a-f]{8}_[A-Za-z0-9_-]{20,}$")
EXAMPLE_APP = "tests.acceptance.example_app:app"


@pytest.fixture
def cli(db_url: str, tmp_path: Path) -> Cli:
    return Cli(db_url, tmp_path)


def client(base_url: str, key: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=base_url, headers=headers, timeout=30, trust_env=False)


def answers_healthz(base_url: str) -> bool:
    try:
        with client(base_url) as http:
            return http.get("/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def serving(
    cli: Cli, *args: str, stop: signal.Signals = signal.SIGTERM, stop_within: float = 30
) -> Iterator[str]:
    """``runlane serve`` on a free port until the block ends; then ``stop``
    must end it cleanly (exit 0, no traceback) within ``stop_within`` s."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log_path = cli.tmp_path / f"serve-{port}.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            cli_command("serve", "--port", str(port), *args),
            env=cli.env(),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        wait_for(
            lambda: process.poll() is not None or answers_healthz(base_url),
            timeout=60,
            what="runlane serve to answer /healthz",
        )
        assert process.poll() is None, log_path.read_text()
        yield base_url
        process.send_signal(stop)
        code = process.wait(timeout=stop_within)
        output = log_path.read_text()
        assert code == 0, output
        assert "Traceback" not in output, output
        assert f"HTTP API on {base_url}" in output, output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def create_key(cli: Cli, tenant: str, user: str, *args: str) -> str:
    result = cli("keys", "create", "--tenant", tenant, "--user", user, *args)
    assert result.returncode == 0, result.stderr
    [key] = result.stdout.splitlines()
    assert KEY.match(key), key
    return key


def prefix_of(key: str) -> str:
    return key[: len("rl_") + 8]


def list_keys(cli: Cli, *args: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(cli.ok("keys", "list", "--json", *args))
    return found


def error_code(response: httpx.Response) -> str:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return str(body["error"]["code"])


# -- keys ---------------------------------------------------------------------


def test_keys_are_shown_once_and_stored_as_hashes(cli: Cli, sql: psycopg.Connection[Any]) -> None:
    created = cli("keys", "create", "--tenant", "acme", "--user", "alice")
    assert created.returncode == 0, created.stderr
    [key] = created.stdout.splitlines()
    assert KEY.match(key), key
    assert prefix_of(key) in created.stderr and "shown only once" in created.stderr
    assert "tenant acme, user alice" in created.stderr

    as_json = json.loads(
        cli.ok(
            "keys",
            "create",
            "--tenant",
            "acme",
            "--user",
            "root",
            "--admin",
            "--name",
            "ops",
            "--json",
        )
    )
    assert KEY.match(as_json["key"])
    assert as_json["prefix"] == prefix_of(as_json["key"])
    assert (as_json["tenant"], as_json["user_id"], as_json["admin"], as_json["name"]) == (
        "acme",
        "root",
        True,
        "ops",
    )
    assert as_json["revoked_at"] is None and as_json["last_used_at"] is None
    create_key(cli, "other", "bob")

    # Only hashes are stored: no column holds a secret.
    rows = sql.execute("SELECT prefix, key_hash, row_to_json(k)::text FROM runlane.api_keys k")
    stored = {prefix: (key_hash, row) for prefix, key_hash, row in rows.fetchall()}
    assert len(stored) == 3
    for secret in (key, as_json["key"]):
        key_hash, row = stored[prefix_of(secret)]
        assert key_hash == hashlib.sha256(secret.encode()).hexdigest()
        assert secret not in row

    # Listings show prefixes and scopes, never the secrets.
    listed = list_keys(cli)
    assert sorted(k["prefix"] for k in listed) == sorted(stored)
    assert [(k["tenant"], k["user_id"], k["admin"]) for k in listed] == [
        ("acme", "alice", False),
        ("acme", "root", True),
        ("other", "bob", False),
    ]
    assert all("key" not in k and "key_hash" not in k for k in listed)
    assert [k["user_id"] for k in list_keys(cli, "--tenant", "acme")] == ["alice", "root"]
    human = cli.ok("keys", "list")
    assert all(prefix in human for prefix in stored)
    assert key not in human and as_json["key"] not in human
    assert "ops" in human and "yes" in human
    assert cli.ok("keys", "list", "--tenant", "nobody").strip() == "no keys"


def test_keys_refuse_bad_input_with_one_line(cli: Cli) -> None:
    assert "tenant must be" in cli.error("keys", "create", "--tenant", "a b", "--user", "u")
    assert "--user" in cli.error("keys", "create", "--tenant", "t")
    assert "no key 'rl_00000000'" in cli.error("keys", "revoke", "rl_00000000")


def test_a_revoked_key_gets_401(cli: Cli, sql: psycopg.Connection[Any]) -> None:
    alice = create_key(cli, "acme", "alice")
    bob = create_key(cli, "acme", "bob")
    admin = create_key(cli, "acme", "root", "--admin")

    with serving(cli) as base_url:
        with client(base_url) as anonymous:
            response = anonymous.get("/v1/runs")
            assert response.status_code == 401 and error_code(response) == "unauthorized"
        with client(base_url, alice) as http:
            assert http.get("/v1/runs").status_code == 200
            # Without --app, any agent name is accepted (a worker decides).
            assert http.post("/v1/runs", json={"agent": "anything"}).status_code == 201
        assert list_keys(cli, "--tenant", "acme")[0]["last_used_at"] is not None

        out = cli.ok("keys", "revoke", prefix_of(alice))
        assert f"revoked key {prefix_of(alice)} (tenant acme, user alice)" in out
        with client(base_url, alice) as http:
            # Revoked in another process: the server stops trusting the key
            # within RUNLANE_API_KEY_CACHE_SECONDS (default 2 s).
            revoked_at = time.monotonic()
            response = wait_for(
                lambda: (r := http.get("/v1/runs")).status_code == 401 and r,
                timeout=10,
                what="the revoked key refused",
            )
            assert time.monotonic() - revoked_at < 2 + 3  # the TTL, plus a slow machine
            assert error_code(response) == "unauthorized"
            submitted = http.post("/v1/runs", json={"agent": "anything"})
            assert submitted.status_code == 401

        # The whole key names it too; revoking again is harmless.
        revoked = json.loads(cli.ok("keys", "revoke", bob, "--json"))
        assert revoked["prefix"] == prefix_of(bob) and revoked["revoked_at"]
        again = json.loads(cli.ok("keys", "revoke", prefix_of(bob), "--json"))
        assert again["revoked_at"] == revoked["revoked_at"]
        with client(base_url, bob) as http:
            wait_for(
                lambda: http.get("/v1/runs").status_code == 401, timeout=10, what="bob refused"
            )
        with client(base_url, admin) as http:
            listed = http.get("/v1/runs").json()["items"]
            assert [run["agent"] for run in listed] == ["anything"]

    listed = {k["user_id"]: k for k in list_keys(cli)}
    assert listed["alice"]["revoked_at"] and listed["bob"]["revoked_at"]
    assert listed["root"]["revoked_at"] is None
    assert "revoked" in cli.ok("keys", "list")
    revoked_rows = sql.execute(
        "SELECT count(*) FROM runlane.api_keys WHERE revoked_at IS NOT NULL"
    ).fetchone()
    assert revoked_rows == (2,)


# -- serve ----------------------------------------------------------------------


def test_serve_with_an_app_refuses_unknown_agents(cli: Cli) -> None:
    key = create_key(cli, "acme", "alice")
    with cli.worker(), serving(cli, "--app", EXAMPLE_APP, stop=signal.SIGINT) as base_url:
        with client(base_url, key) as http:
            for path in ("/v1/runs", "/v1/threads/t1/requests"):
                response = http.post(path, json={"agent": "nope", "input": {}})
                assert response.status_code == 422, response.text
                assert error_code(response) == "unknown_agent"
                assert "nope" in response.json()["error"]["message"]

            # A known agent: submitted into a thread, dispatched, served by
            # the worker, and followed over SSE to its end.
            response = http.post(
                "/v1/threads/t1/requests", json={"agent": "echo", "input": {"a": 1, "b": 2}}
            )
            assert response.status_code == 201, response.text
            request = response.json()
            assert request["status"] == "dispatched" and request["run_id"]
            events = read_stream(http, f"/v1/runs/{request['run_id']}/events")
        assert [(e.get("id"), e["event"]) for e in events] == [
            ("1", "key"),
            ("2", "key"),
            (None, "end"),
        ]
        assert events[-1]["data"]["status"] == "completed"
        assert events[-1]["data"]["output"] == {"echo": {"a": 1, "b": 2}, "attempt": 1}


def read_stream(http: httpx.Client, path: str) -> list[dict[str, Any]]:
    """A run's server-sent events up to ``end``."""
    events: list[dict[str, Any]] = []
    fields: dict[str, Any] = {}
    with http.stream("GET", path) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith(":"):
                continue
            if line:
                name, _, value = line.partition(": ")
                fields[name] = json.loads(value) if name == "data" else value
                continue
            if fields:
                events.append(fields)
                if fields["event"] == "end":
                    return events
            fields = {}
    raise AssertionError(f"the stream ended without 'end': {events}")


def test_serve_stops_on_sigterm_with_a_stream_open(cli: Cli) -> None:
    key = create_key(cli, "acme", "alice")
    opened = threading.Event()
    ended: list[BaseException | None] = []

    def follow(base_url: str, run_id: str) -> None:
        # No worker: the run stays pending and its stream stays open.
        try:
            with (
                client(base_url, key) as http,
                http.stream("GET", f"/v1/runs/{run_id}/events") as response,
            ):
                opened.set()
                for _ in response.iter_lines():
                    pass
            ended.append(None)
        except BaseException as exc:
            ended.append(exc)

    with serving(cli, stop_within=20) as base_url:
        with client(base_url, key) as http:
            run = http.post("/v1/runs", json={"agent": "echo"}).json()
        follower = threading.Thread(target=follow, args=(base_url, run["run_id"]), daemon=True)
        follower.start()
        assert opened.wait(10)
        stopping = time.monotonic()
    # serving() sent SIGTERM and saw exit 0 without a traceback: the open
    # stream was disconnected, not waited for until the graceful timeout.
    assert time.monotonic() - stopping < GRACEFUL_SHUTDOWN_SECONDS
    follower.join(10)
    assert ended, "the stream was not closed"
    [log] = cli.tmp_path.glob("serve-*.log")
    output = log.read_text()
    assert "closed 1 open event stream(s)" in output, output
    assert "timeout graceful shutdown exceeded" not in output, output


def test_serve_reports_a_port_in_use_in_one_line(cli: Cli) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = cli.error("serve", "--port", str(port))
    assert f"cannot listen on 127.0.0.1:{port}" in line


def test_serve_refuses_a_bad_app(cli: Cli) -> None:
    assert "cannot import" in cli.error("serve", "--app", "no_such_module:app")
    assert "MODULE:APP" in cli.error("serve", "--app", "nocolon")
