"""The operator's commands end to end: ``runlane status``, ``workers``,
``runs list|retry --status``, ``tenants``, ``prune`` and ``worker
--metrics-port``; real processes, real PostgreSQL."""

from __future__ import annotations

import json
import socket
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from runlane.cli_ops import format_age, parse_duration
from runlane.cli_runs import CliError
from runlane.models import Outcome
from runlane.service import RunService
from runlane.store import RunStore
from tests.acceptance.test_cli import EXAMPLE_APP, Cli, status_of, wait_for
from tests.api_support import free_port

Conn = psycopg.Connection[Any]


@pytest.fixture
def cli(db_url: str, tmp_path: Path) -> Cli:
    return Cli(db_url, tmp_path)


def as_json(cli: Cli, *args: str, **kwargs: Any) -> Any:
    return json.loads(cli.ok(*args, "--json", **kwargs))


async def kill_all(store: RunStore, outcomes: dict[Any, Outcome]) -> None:
    """Claims every pending run and ends each run named in ``outcomes`` so:
    RETRY with max_attempts=1 makes it dead."""
    claimed = await store.claim_batch(worker_id="test", limit=100, lease_seconds=30)
    assert {c.id for c in claimed} == set(outcomes)
    for c in claimed:
        ended = await store.finish_attempt(
            c.id,
            c.lease_token,
            outcomes[c.id],
            error={"code": "boom", "message": "no"},
            retry_delay_seconds=0,
        )
        assert ended is not None


def scrape(port: int) -> str | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None


# -- status, workers, worker --metrics-port ---------------------------------------


async def test_status_workers_and_metrics_with_a_live_worker(
    cli: Cli, service: RunService, store: RunStore, sql: Conn
) -> None:
    # Two dead runs in the dead letter.
    dead = [
        (await service.submit("mail", {}, tenant=tenant, max_attempts=1))[0]
        for tenant in ("acme", "globex")
    ]
    await kill_all(store, {run.id: Outcome.RETRY for run in dead})
    # A paused lane: its run was cancelled while a request waited.
    first = json.loads(cli.ok("submit", "echo", "--thread", "t1", "--json"))
    cli.ok("submit", "echo", "--thread", "t1")
    cli.ok("runs", "cancel", first["run_id"])
    # Pending runs of an agent the worker below does not serve, one old.
    waiting, _ = await service.submit("echo", {}, tenant="acme")
    await service.submit("echo", {}, tenant="globex")
    sql.execute(
        "UPDATE runlane.runs SET available_at = now() - interval '2 hours' WHERE id = %s",
        (waiting.id,),
    )
    cli.ok("tenants", "set", "acme", "--max-running", "5")

    port = free_port()
    with cli.worker("--agents", "wait-for-cancel", "--metrics-port", str(port)):
        run_id = cli.submit("wait-for-cancel")
        wait_for(lambda: status_of(sql, run_id) == "running", what="the run to start")

        def holding() -> dict[str, Any] | None:
            rows = as_json(cli, "workers")
            alive = [w for w in rows if w["alive"] and w["run_ids"] == [run_id]]
            return alive[0] if alive else None

        worker = wait_for(holding, what="the worker seen alive with its run")
        assert worker["state"] == "alive" and worker["running"] == 1
        assert worker["concurrency"] == 4 and worker["agents"] == ["wait-for-cancel"]
        assert worker["id"].split(":")[1].isdigit()  # host:pid:boot

        status = as_json(cli, "status")
        assert status["totals"] == {"pending": 2, "running": 1, "cancel_requested": 0}
        assert status["dead"] == 2
        assert 7100 < status["oldest_pending_seconds"] < 7400
        live = {(r["status"], r["agent"], r["tenant"]): r["count"] for r in status["live"]}
        assert live == {
            ("pending", "echo", "acme"): 1,
            ("pending", "echo", "globex"): 1,
            ("running", "wait-for-cancel", "default"): 1,
        }
        assert [w["id"] for w in status["workers"] if w["alive"]] == [worker["id"]]
        assert status["workers_alive"] == 1
        [lane] = status["waiting_lanes"]
        assert lane["state"] == "paused" and lane["thread_id"] == "t1"
        assert lane["paused_reason"] == "run_cancelled" and lane["queued"] == 1
        assert lane["run_id"] == first["run_id"]
        assert status["tenant_caps"] == [{"tenant": "acme", "max_running": 5, "running": 0}]

        human = cli.ok("status")
        for words in (
            "dead letter 2",
            "oldest pending 2h0",
            worker["id"],
            run_id[:8],
            "1 paused",
            "run_cancelled",
            "globex",
        ):
            assert words in human, (words, human)

        scoped = as_json(cli, "status", "--tenant", "acme")
        assert scoped["tenant"] == "acme" and scoped["dead"] == 1
        assert scoped["totals"]["pending"] == 1 and scoped["waiting_lanes"] == []

        # The worker's Prometheus metrics, queue gauges (refreshed every few
        # seconds) included.
        running = (
            'runlane_queue_runs{agent="wait-for-cancel",status="running",tenant="default"} 1.0'
        )
        text = wait_for(
            lambda: (t := scrape(port)) and running in t and t,
            what="metrics with the queue gauges",
        )
        assert "runlane_queue_dead_runs 2.0" in text
        assert 'runlane_queue_runs{agent="echo",status="pending",tenant="acme"} 1.0' in text
        assert "runlane_worker_claims_total 1.0" in text
        assert "runlane_worker_running 1.0" in text
        assert 'runlane_queue_oldest_pending_seconds{agent="echo"}' in text
        assert "runlane_worker_lease_renewals_total" in text

        cli.ok("runs", "cancel", run_id)
        wait_for(lambda: status_of(sql, run_id) == "cancelled", what="the run cancelled")
        ended = wait_for(
            lambda: (t := scrape(port)) and 'outcome="cancelled"} 1.0' in t and t,
            what="the cancelled attempt counted",
        )
        assert "runlane_worker_running 0.0" in ended

    # Shut down cleanly: shown as stopped, no longer alive.
    [stopped] = [w for w in as_json(cli, "workers") if w["id"] == worker["id"]]
    assert stopped["state"] == "stopped" and not stopped["alive"]
    assert as_json(cli, "workers", "--alive") == []
    assert as_json(cli, "status")["workers_alive"] == 0
    assert "stopped" in cli.ok("workers")


def test_status_and_workers_on_an_empty_queue(cli: Cli) -> None:
    status = as_json(cli, "status")
    assert status["totals"] == {"pending": 0, "running": 0, "cancel_requested": 0}
    assert status["oldest_pending_seconds"] is None and status["dead"] == 0
    assert status["workers"] == [] and status["waiting_lanes"] == []
    assert "no live runs" in cli.ok("status")
    assert cli.ok("workers").strip() == "no workers"


def test_metrics_port_in_use_is_one_line(cli: Cli) -> None:
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = cli.error("worker", EXAMPLE_APP, "--metrics-port", str(port))
    assert line == f"error: --metrics-port {port}: Address already in use"


# -- runs list --status dead, runs retry --status dead ------------------------------


async def test_bulk_retry_of_the_dead_letter(
    cli: Cli, service: RunService, store: RunStore, sql: Conn
) -> None:
    # A lane's run that will die, then another run of that lane: re-queueing
    # the dead one is refused (the lane has an active run).
    lane_request = json.loads(
        cli.ok("submit", "mail", "--thread", "t9", "--max-attempts", "1", "--json")
    )
    lane_run = lane_request["run_id"]
    direct = {
        name: (await service.submit(agent, {}, tenant=tenant, max_attempts=1))[0]
        for name, agent, tenant in (
            ("a1", "mail", "a"),
            ("a2", "mail", "a"),
            ("b1", "mail", "b"),
            ("chat", "chat", "a"),
            ("failed", "mail", "a"),
        )
    }
    outcomes = {run.id: Outcome.RETRY for run in direct.values()}
    outcomes[direct["failed"].id] = Outcome.FAILED
    outcomes[uuid.UUID(lane_run)] = Outcome.RETRY
    await kill_all(store, outcomes)
    active = json.loads(cli.ok("submit", "mail", "--thread", "t9", "--json"))
    assert active["status"] == "dispatched"

    dead_mail = as_json(cli, "runs", "list", "--status", "dead", "--agent", "mail")
    assert {r["id"] for r in dead_mail} == {
        str(direct["a1"].id),
        str(direct["a2"].id),
        str(direct["b1"].id),
        lane_run,
    }
    assert {r["status"] for r in dead_mail} == {"dead"}
    dead_b = as_json(cli, "runs", "list", "--status", "dead", "--tenant", "b")
    assert [r["id"] for r in dead_b] == [str(direct["b1"].id)]
    assert str(direct["chat"].id) in cli.ok("runs", "list", "--status", "dead")

    # One tenant's dead mail runs.
    done = as_json(cli, "runs", "retry", "--status", "dead", "--agent", "mail", "--tenant", "a")
    assert done["requeued"] == 2 and done["refused"] == 0 and not done["limit_reached"]
    assert set(done["requeued_ids"]) == {str(direct["a1"].id), str(direct["a2"].id)}
    assert {status_of(sql, str(direct[n].id)) for n in ("a1", "a2")} == {"pending"}

    # The rest of the dead mail: one re-queued, the lane's run refused.
    out = cli.ok("runs", "retry", "--status", "dead", "--agent", "mail")
    assert "re-queued 1 runs; refused 1" in out
    assert f"refused {lane_run} (mail): run_active" in out
    assert status_of(sql, str(direct["b1"].id)) == "pending"
    assert status_of(sql, lane_run) == "dead"

    # --limit: at most that many, and says when more may match.
    limited = as_json(cli, "runs", "retry", "--status", "dead", "--limit", "1")
    assert limited["requeued"] + limited["refused"] == 1 and limited["limit_reached"]

    # Failed runs only when asked; the dead letter stays otherwise untouched.
    assert status_of(sql, str(direct["failed"].id)) == "failed"
    failed = as_json(cli, "runs", "retry", "-s", "failed", "--agent", "mail")
    assert failed["requeued_ids"] == [str(direct["failed"].id)]
    nothing = as_json(cli, "runs", "retry", "--status", "dead", "--agent", "nobody")
    assert (nothing["requeued"], nothing["refused"]) == (0, 0)

    # One run by id still works.
    chat = str(direct["chat"].id)
    if status_of(sql, chat) == "dead":
        assert "re-queued" in cli.ok("runs", "retry", chat)
    assert status_of(sql, chat) == "pending"


# -- tenants --------------------------------------------------------------------


async def test_tenant_caps_set_list_and_remove(cli: Cli, service: RunService) -> None:
    await service.submit("echo", {}, tenant="acme")
    await service.submit("echo", {}, tenant="acme")
    await service.submit("echo", {}, tenant="initech")

    assert "at most 2 running (0 running now)" in cli.ok(
        "tenants", "set", "acme", "--max-running", "2"
    )
    assert as_json(cli, "tenants", "set", "hooli", "--max-running", "0") == {
        "tenant": "hooli",
        "max_running": 0,
        "running": 0,
    }
    assert as_json(cli, "tenants", "list") == [
        {"tenant": "acme", "max_running": 2, "running": 0, "pending": 2},
        {"tenant": "hooli", "max_running": 0, "running": 0, "pending": 0},
        {"tenant": "initech", "max_running": None, "running": 0, "pending": 1},
    ]
    table = cli.ok("tenants", "list")
    assert "unlimited" in table and "hooli" in table

    assert "no cap" in cli.ok("tenants", "set", "hooli", "--unlimited")
    assert as_json(cli, "tenants", "set", "acme", "--unlimited")["max_running"] is None
    assert [t["tenant"] for t in as_json(cli, "tenants", "list")] == ["acme", "initech"]
    assert all(t["max_running"] is None for t in as_json(cli, "tenants", "list"))


# -- prune ----------------------------------------------------------------------


def test_prune_on_demand_and_by_retention(cli: Cli, sql: Conn) -> None:
    def insert(status: str, age: str, n: int = 1) -> None:
        sql.execute(
            "INSERT INTO runlane.runs (agent, input, max_attempts, status, finished_at)"
            " SELECT 'a', '{}', 3, %s, now() - %s::interval FROM generate_series(1, %s)",
            (status, age, n),
        )

    insert("completed", "3 hours", 3)
    insert("completed", "1 hour")
    insert("cancelled", "3 hours")
    insert("dead", "2 days")
    insert("failed", "10 days")
    insert("interrupted", "30 days")  # waits for a human: never pruned
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, created_at)"
        " VALUES ('a', '{}', 3, now() - interval '30 days')"
    )

    def left() -> dict[str, int]:
        rows = sql.execute("SELECT status, count(*) FROM runlane.runs GROUP BY status")
        return {str(status): int(count) for status, count in rows.fetchall()}

    # The retention settings (7 days; dead runs one day here).
    out = cli.ok("prune", env={"RUNLANE_RETENTION_BY_STATUS": '{"dead": 86400}'})
    assert out.strip() == "deleted 2 runs and 0 requests"
    assert left() == {"completed": 4, "cancelled": 1, "interrupted": 1, "pending": 1}

    assert as_json(cli, "prune", "--older-than", "2h") == {
        "runs": 4,
        "requests": 0,
        "older_than_seconds": 7200.0,
    }
    assert left() == {"completed": 1, "interrupted": 1, "pending": 1}
    assert "deleted 0 runs" in cli.ok("prune", "--older-than", "1h30m")
    assert "deleted 1 runs" in cli.ok("prune", "--older-than", "1800")
    assert left() == {"interrupted": 1, "pending": 1}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("3600", 3600.0),
        ("7d", 7 * 86400.0),
        ("12h", 43200.0),
        ("30m", 1800.0),
        ("45s", 45.0),
        ("1h30m", 5400.0),
        ("2w", 1209600.0),
        ("0.5h", 1800.0),
        (" 7D ", 7 * 86400.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "7x", "-5", "h", "1h 30m", "7d!"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(CliError, match="--older-than"):
        parse_duration(text)


def test_ages_read_well() -> None:
    assert [format_age(s) for s in (None, 0.25, 42.9, 192, 7500, 3 * 86400 + 4 * 3600)] == [
        "-",
        "0.2s",
        "42s",
        "3m12s",
        "2h05m",
        "3d04h",
    ]


# -- errors: one line, non-zero -------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["runs", "retry"], "give a RUN_ID, or --status dead"),
        (["runs", "retry", "--agent", "mail"], "give a RUN_ID, or --status dead"),
        (["runs", "retry", "--status", "completed"], "only failed or dead runs"),
        (["runs", "retry", str(uuid.uuid4()), "--status", "dead"], "not both"),
        (["runs", "retry", str(uuid.uuid4()), "--limit", "5"], "not both"),
        (["runs", "retry", "--status", "dead", "--limit", "0"], "limit must be 1-10000"),
        (["runs", "retry", "--status", "nonsense"], "nonsense"),
        (["tenants", "set", "acme"], "give either --max-running N or --unlimited"),
        (["tenants", "set", "acme", "--max-running", "2", "--unlimited"], "either"),
        (["tenants", "set", "acme", "--max-running", "-1"], "--max-running"),
        (["tenants", "set", "", "--max-running", "1"], "a tenant is needed"),
        (["prune", "--older-than", "soon"], "expected a duration"),
        (["prune", "--older-than", "-5"], "expected a duration"),
        (["worker", EXAMPLE_APP, "--metrics-port", "0"], "--metrics-port"),
        (["worker", EXAMPLE_APP, "--metrics-port", "70000"], "--metrics-port"),
    ],
)
def test_bad_operator_input_is_one_clear_line(cli: Cli, args: list[str], expected: str) -> None:
    assert expected in cli.error(*args)
