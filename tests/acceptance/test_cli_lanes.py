"""``runlane submit --thread``, ``lanes``, ``requests`` and ``runs resume``
end to end: real processes, real PostgreSQL."""

from __future__ import annotations

import itertools
import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runlane.models import Outcome
from runlane.store import RunStore
from tests.acceptance.test_cli import ROOT, Cli, cli_command, status_of, wait_for


@pytest.fixture
def cli(db_url: str, tmp_path: Path) -> Cli:
    return Cli(db_url, tmp_path)


def submit(cli: Cli, thread: str, payload: Any, *args: str) -> dict[str, Any]:
    """``submit echo --thread T --json``: the request as JSON."""
    out = cli.ok(
        "submit", "echo", "--thread", thread, "--input", json.dumps(payload), "--json", *args
    )
    [line] = out.splitlines()
    data: dict[str, Any] = json.loads(line)
    assert data["type"] == "request"
    return data


def lane(cli: Cli, thread: str, *args: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        cli.ok("lanes", "show", thread, "--agent", "echo", "--json", *args)
    )
    return data


def request(cli: Cli, request_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(cli.ok("requests", "show", request_id, "--json"))
    return data


def pause(cli: Cli, thread: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Leaves ``thread``'s lane paused: a dispatched request whose run was
    cancelled, and a queued request behind it."""
    first = submit(cli, thread, {"n": 1})
    second = submit(cli, thread, {"n": 2})
    cli.ok("runs", "cancel", first["run_id"])
    shown = lane(cli, thread)
    assert (shown["state"], shown["paused_reason"]) == ("paused", "run_cancelled")
    return first, second


# -- submit into a thread --------------------------------------------------------


def test_submit_into_a_thread_dispatches_then_queues_in_order(
    cli: Cli, sql: psycopg.Connection[Any]
) -> None:
    first = submit(cli, "t1", {"n": 1}, "--request-id", "r1")
    assert first["created"] is True
    assert (first["request_id"], first["status"], first["policy"]) == (
        "r1",
        "dispatched",
        "enqueue",
    )
    assert first["steer"] is False and first["position"] is None and first["reason"] is None
    assert status_of(sql, first["run_id"]) == "pending"

    second = submit(cli, "t1", {"n": 2}, "--request-id", "r2")
    third = submit(cli, "t1", {"n": 3}, "--request-id", "r3")
    assert [(r["status"], r["position"], r["run_id"]) for r in (second, third)] == [
        ("queued", 1, None),
        ("queued", 2, None),
    ]
    # Queued input has no run yet.
    [(runs,)] = sql.execute("SELECT count(*) FROM runlane.runs").fetchall()
    assert runs == 1

    shown = lane(cli, "t1")
    assert shown["state"] == "running" and shown["paused_reason"] is None
    assert shown["run_id"] == first["run_id"]
    assert (shown["tenant"], shown["user_id"], shown["agent"], shown["thread_id"]) == (
        "default",
        "default",
        "echo",
        "t1",
    )
    assert [(r["request_id"], r["position"], r["input"]) for r in shown["queued"]] == [
        ("r2", 1, {"n": 2}),
        ("r3", 2, {"n": 3}),
    ]
    human = cli.ok("lanes", "show", "t1", "--agent", "echo")
    assert "running" in human and first["run_id"] in human and "r3" in human

    # Human output: the request id, then where it stands.
    out = cli.ok("submit", "echo", "--thread", "t1", "--input", '{"n": 4}', "--request-id", "r4")
    assert out.splitlines() == ["r4", "queued at position 3"]
    fresh = cli.ok("submit", "echo", "--thread", "other").splitlines()
    assert fresh[1].startswith("dispatched as run ")
    uuid.UUID(fresh[1].rsplit(" ", 1)[1])

    # The same request id and input returns the same request: nothing twice.
    again = cli("submit", "echo", "--thread", "t1", "--input", '{"n": 2}', "--request-id", "r2")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == ["r2", "queued at position 1"]
    assert "existing request" in again.stderr
    # Other input under the same request id is refused with a code.
    line = cli.error(
        "submit", "echo", "--thread", "t1", "--input", '{"n": 9}', "--request-id", "r2"
    )
    assert line.startswith("error: request_id_conflict: ")

    # requests show: live position; cancel moves the rest up; steer goes first.
    assert request(cli, "r3")["position"] == 2
    assert "queued at position 2" in cli.ok("requests", "show", "r3")
    assert cli.ok("requests", "cancel", "r2").strip() == "request r2 cancelled"
    assert request(cli, "r3")["position"] == 1
    assert request(cli, "r4")["position"] == 2
    # Promoted to steer, it goes first; the run not started yet is asked to
    # yield and will do so at its first safe point.
    steered = json.loads(cli.ok("requests", "steer", "r4", "--json"))
    assert (steered["status"], steered["steer"], steered["position"]) == ("queued", True, 1)
    assert steered["policy"] == "enqueue"  # the original submission's policy
    shown = lane(cli, "t1")
    assert shown["run_id"] == first["run_id"]
    assert [(r["request_id"], r["position"]) for r in shown["queued"]] == [("r4", 1), ("r3", 2)]
    # Cancelling again is harmless; a dispatched request names its run instead.
    assert json.loads(cli.ok("requests", "cancel", "r2", "--json"))["status"] == "cancelled"
    line = cli.error("requests", "cancel", "r1")
    assert line.startswith("error: request_already_dispatched: ") and first["run_id"] in line
    assert cli.error("requests", "steer", "r2").startswith("error: request_not_queued: ")
    assert "no request 'nope'" in cli.error("requests", "show", "nope")


def test_reject_on_a_busy_lane_is_a_normal_result(cli: Cli) -> None:
    first = submit(cli, "t1", {"n": 1}, "--policy", "reject")
    assert first["status"] == "dispatched"
    rejected = submit(cli, "t1", {"n": 2}, "--policy", "reject", "--request-id", "late")
    assert (rejected["status"], rejected["reason"], rejected["policy"]) == (
        "rejected",
        "lane_busy",
        "reject",
    )
    assert rejected["run_id"] is None and rejected["position"] is None
    out = cli.ok("submit", "echo", "--thread", "t1", "--policy", "reject")
    assert out.splitlines()[1] == "rejected: lane_busy (the lane has an active run)"
    # Stored, and nothing waits.
    assert request(cli, "late")["status"] == "rejected"
    assert lane(cli, "t1")["queued"] == []
    # With --wait, a rejection ends the wait at once with its own exit code.
    waited = cli("submit", "echo", "--thread", "t1", "--policy", "reject", "--wait")
    assert waited.returncode == 4, waited.stderr
    assert "rejected: lane_busy" in waited.stdout


def test_a_second_steer_is_refused_and_continue_dispatches_the_head(
    cli: Cli, sql: psycopg.Connection[Any]
) -> None:
    first, second = pause(cli, "t1")
    # A paused lane queues new work and rejects a reject.
    rejected = submit(cli, "t1", {}, "--policy", "reject")
    assert (rejected["status"], rejected["reason"]) == ("rejected", "lane_paused")
    steer = submit(cli, "t1", {"steer": 1}, "--policy", "steer", "--request-id", "s1")
    assert (steer["status"], steer["steer"], steer["position"]) == ("queued", True, 1)
    assert request(cli, second["request_id"])["position"] == 2
    line = cli.error("submit", "echo", "--thread", "t1", "--policy", "steer", "--input", "{}")
    assert line == "error: steer_already_pending: the lane already has a queued steer"
    assert cli.error("requests", "steer", second["request_id"]).startswith(
        "error: steer_already_pending: "
    )

    human = cli.ok("lanes", "show", "t1", "--agent", "echo")
    assert "paused: run_cancelled" in human and first["run_id"] in human

    # continue dispatches only the head: the steer.
    continued = json.loads(cli.ok("lanes", "continue", "t1", "--agent", "echo", "--json"))
    assert (continued["request_id"], continued["status"]) == ("s1", "dispatched")
    assert status_of(sql, continued["run_id"]) == "pending"
    shown = lane(cli, "t1")
    assert shown["state"] == "running" and shown["run_id"] == continued["run_id"]
    assert [(r["request_id"], r["position"]) for r in shown["queued"]] == [
        (second["request_id"], 1)
    ]
    line = cli.error("lanes", "continue", "t1", "--agent", "echo")
    assert line == "error: run_active: the lane has an active run"


def test_continue_and_resume_refusals(cli: Cli) -> None:
    submit(cli, "t1", {})
    line = cli.error("lanes", "continue", "never-used", "--agent", "echo")
    assert line == "error: queue_not_paused: the lane is not paused"
    line = cli.error("lanes", "continue", "t1", "--agent", "echo", "--user", "someone-else")
    assert line.startswith("error: queue_not_paused: ")
    run_id = submit(cli, "t2", {})["run_id"]
    line = cli.error("runs", "resume", run_id, "--value", '{"ok": true}')
    assert line == f"error: not_interrupted: run {run_id} is not interrupted"
    assert "--value is not valid JSON" in cli.error("runs", "resume", run_id, "--value", "{")
    assert "Missing option '--agent'" in cli.error("lanes", "show", "t1")
    assert "--policy needs --thread" in cli.error("submit", "echo", "--policy", "steer")
    assert "use --request-id" in cli.error(
        "submit", "echo", "--thread", "t1", "--idempotency-key", "k"
    )
    assert "thread_id must be" in cli.error("submit", "echo", "--thread", "bad thread")


def test_tenant_and_user_scope_the_lane(cli: Cli) -> None:
    ann = submit(cli, "t1", {}, "--user", "ann", "--tenant", "acme")
    bob = json.loads(
        cli.ok(
            "submit",
            "echo",
            "--thread",
            "t1",
            "--json",
            env={"RUNLANE_USER": "bob", "RUNLANE_TENANT": "acme"},
        )
    )
    # Same thread, other user: another lane, dispatched too.
    assert ann["status"] == bob["status"] == "dispatched"
    assert (bob["tenant"], bob["user_id"]) == ("acme", "bob")
    assert lane(cli, "t1", "--tenant", "acme", "--user", "ann")["run_id"] == ann["run_id"]
    assert lane(cli, "t1")["state"] == "idle"  # the default tenant and user
    # Request ids are per tenant.
    assert "no request" in cli.error("requests", "show", ann["request_id"])
    shown = json.loads(cli.ok("requests", "show", ann["request_id"], "--tenant", "acme", "--json"))
    assert shown["run_id"] == ann["run_id"]


# -- interrupt and resume -----------------------------------------------------------


async def test_an_interrupted_lane_refuses_new_work_until_resumed(
    cli: Cli, store: RunStore
) -> None:
    first = submit(cli, "t1", {"n": 1})
    second = submit(cli, "t1", {"n": 2})
    [claimed] = await store.claim_batch(worker_id="test", limit=1, lease_seconds=30)
    assert str(claimed.id) == first["run_id"]
    await store.finish_attempt(
        claimed.id,
        claimed.lease_token,
        Outcome.INTERRUPTED,
        interrupt={"ask": "approve?"},
        lane_id=claimed.lane_id,
    )
    shown = lane(cli, "t1")
    assert (shown["state"], shown["run_id"]) == ("interrupted", first["run_id"])
    assert "interrupted run" in cli.ok("lanes", "show", "t1", "--agent", "echo")

    line = cli.error("submit", "echo", "--thread", "t1", "--input", "{}")
    assert line.startswith("error: run_interrupted: ")
    assert cli.error("submit", "echo", "--thread", "t1", "--policy", "steer").startswith(
        "error: run_interrupted: "
    )
    rejected = submit(cli, "t1", {}, "--policy", "reject")
    assert (rejected["status"], rejected["reason"]) == ("rejected", "run_interrupted")
    assert cli.error("lanes", "continue", "t1", "--agent", "echo").startswith(
        "error: run_interrupted: "
    )

    resumed = cli.ok("runs", "resume", first["run_id"], "--value", '{"approved": true}').strip()
    again = cli("runs", "resume", first["run_id"], "--value", '{"approved": true}')
    assert again.returncode == 0 and again.stdout.strip() == resumed
    assert "existing resume" in again.stderr
    line = cli.error("runs", "resume", first["run_id"], "--value", '{"approved": false}')
    assert line.startswith("error: resume_superseded: ")
    run = cli.show(resumed)["run"]
    assert (run["kind"], run["resumed_from"], run["resume_value"]) == (
        "resume",
        first["run_id"],
        {"approved": True},
    )
    shown = lane(cli, "t1")
    assert (shown["state"], shown["run_id"]) == ("running", resumed)
    assert [r["request_id"] for r in shown["queued"]] == [second["request_id"]]
    human = cli.ok("runs", "show", resumed)
    assert "resume" in human and "approved" in human


# -- with a worker ------------------------------------------------------------------


def test_wait_follows_the_request_through_the_queue_to_its_run(
    cli: Cli, sql: psycopg.Connection[Any]
) -> None:
    first = submit(cli, "t1", {"n": 1})
    second = submit(cli, "t1", {"n": 2})
    waiting = subprocess.Popen(
        cli_command(
            "submit",
            "echo",
            "--thread",
            "t1",
            "--input",
            '{"n": 3}',
            "--wait",
            "--timeout",
            "60",
            "--request-id",
            "r3",
        ),
        env=cli.env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: sql.execute(
                "SELECT 1 FROM runlane.requests WHERE request_id = 'r3'"
            ).fetchone(),
            what="the third request to be stored",
        )
        with cli.worker():
            out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate(timeout=10)
    assert waiting.returncode == 0, err
    lines = out.splitlines()
    assert lines[:2] == ["r3", "queued at position 2"]
    assert lines[-1].startswith("run ") and "completed" in lines[-1]
    assert any(line.startswith("dispatched as run ") for line in lines)
    # The lane ran its requests one after another, in server order.
    rows = sql.execute(
        "SELECT r.request_id, u.started_at, u.finished_at FROM runlane.requests AS r"
        " JOIN runlane.runs AS u ON u.id = r.run_id ORDER BY u.started_at"
    ).fetchall()
    assert [row[0] for row in rows] == [first["request_id"], second["request_id"], "r3"]
    assert all(a[2] <= b[1] for a, b in itertools.pairwise(rows))


def test_a_steer_makes_the_running_run_yield(cli: Cli, sql: psycopg.Connection[Any]) -> None:
    with cli.worker():
        out = cli.ok(
            "submit", "wait-for-cancel", "--thread", "t1", "--json", "--request-id", "long"
        )
        long_run = json.loads(out)["run_id"]
        wait_for(lambda: status_of(sql, long_run) == "running", what="the run to start")
        steer = json.loads(
            cli.ok("submit", "wait-for-cancel", "--thread", "t1", "--policy", "steer", "--json")
        )
        assert steer["steer"] is True and steer["status"] in ("queued", "dispatched")
        wait_for(
            lambda: request(cli, steer["request_id"])["status"] == "dispatched",
            what="the steer to be dispatched",
        )
        yielded = cli.show(long_run)["run"]
        assert (yielded["status"], yielded["outcome"]) == ("completed", "steered")
        assert "steered" in cli.ok("runs", "show", long_run)
        steer_run = request(cli, steer["request_id"])["run_id"]
        wait_for(lambda: status_of(sql, steer_run) == "running", what="the steer to run")
        assert cli.error("requests", "cancel", "long").startswith(
            "error: request_already_dispatched: "
        )
        cli.ok("runs", "cancel", steer_run)
        wait_for(lambda: status_of(sql, steer_run) == "cancelled", what="the cancel")
