"""Ways a worker could silently stop doing its job, and why it does not."""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import psycopg
import pytest

from runlane import App, Retry, RunContext
from runlane.errors import RunFinished
from runlane.migrations import migrate
from runlane.models import Outcome, RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import RunStore
from tests.conftest import database_url
from tests.support import running_worker, wait_until

Conn = psycopg.Connection[Any]


async def wait_for_status(service: RunService, run_id: Any, status: RunStatus) -> Any:
    async def reached() -> Any:
        run = await service.get(run_id)
        return run if run.status is status else None

    return await wait_until(reached, timeout=15, message=f"run {status}")


def terminate_other_backends(sql: Conn) -> None:
    sql.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )


async def test_worker_keeps_claiming_after_a_read_only_spell(
    service: RunService, settings: Settings, sql: Conn
) -> None:
    """A failover-like spell where every write fails (not a connection error)
    must not kill the claim, heartbeat or reaper loops."""
    app = App(settings)

    @app.agent("echo")
    async def echo(ctx: RunContext) -> Any:
        return ctx.input

    async with running_worker(app, settings) as worker:
        dbname = sql.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        sql.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on')
        terminate_other_backends(sql)
        # The claim loop meets the read-only database, more than once.
        await wait_until(lambda: worker.claim_failures >= 2, message="failed claims")
        sql.execute(f'ALTER DATABASE "{dbname}" RESET default_transaction_read_only')
        terminate_other_backends(sql)
        run, _ = await service.submit("echo", {"after": "spell"})
        done = await wait_for_status(service, run.id, RunStatus.COMPLETED)
    assert done.output == {"after": "spell"}


@pytest.mark.parametrize(("value", "problem"), [(math.nan, "must be finite"), ("a\x00b", "NUL")])
async def test_output_the_database_cannot_store_fails_at_once(
    service: RunService, settings: Settings, value: Any, problem: str
) -> None:
    app = App(settings)
    calls = 0

    @app.agent("odd")
    async def odd(ctx: RunContext) -> Any:
        nonlocal calls
        calls += 1
        return {"value": value}

    run, _ = await service.submit("odd", {}, max_attempts=3)
    async with running_worker(app, settings):
        done = await wait_for_status(service, run.id, RunStatus.FAILED)
    assert done.error["code"] == "invalid_output" and problem in done.error["message"]
    assert calls == 1 and done.attempts == 1


async def test_a_handler_cancelled_by_its_own_code_is_retried_at_once(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)

    @app.agent("self-cancel")
    async def self_cancel(ctx: RunContext) -> Any:
        if ctx.attempt == 1:
            helper = asyncio.create_task(asyncio.sleep(60))
            helper.cancel()
            await helper  # raises CancelledError inside the handler
        return "second attempt"

    run, _ = await service.submit("self-cancel", {})

    async def retried() -> Any:
        current = await service.get(run.id)
        return current if current.status is RunStatus.PENDING and current.attempts else None

    async with running_worker(app, settings):
        done = await wait_until(retried, message="first attempt retried")
        attempts = await service.attempts(run.id)
    assert attempts[0].outcome == "retry"
    assert attempts[0].error is not None and attempts[0].error["type"] == "CancelledError"
    assert done.error["code"] == "exception"


def test_retry_and_budget_waits_are_bounded() -> None:
    with pytest.raises(ValueError, match="delay"):
        Retry(delay=1e13)


async def test_one_busy_row_does_not_stall_the_other_leases(
    service: RunService, settings: Settings, db_url: str
) -> None:
    app = App(settings)
    release = asyncio.Event()

    @app.agent("hold")
    async def hold(ctx: RunContext) -> Any:
        await release.wait()
        return ctx.attempt

    runs = [(await service.submit("hold", {"i": i}))[0] for i in range(3)]
    async with running_worker(app, settings) as worker:
        await wait_until(lambda: len(worker.executions) == 3, message="three runs held")
        ticks = worker.heartbeat.ticks
        with psycopg.connect(db_url) as locker:
            locker.execute(
                "SELECT 1 FROM runlane.runs WHERE id = %s FOR NO KEY UPDATE", (runs[0].id,)
            )
            # Several heartbeats go by while the row stays locked.
            await wait_until(lambda: worker.heartbeat.ticks >= ticks + 3, message="renewals")
            assert len(worker.executions) == 3
            locker.rollback()
        release.set()
        for run in runs:
            done = await wait_for_status(service, run.id, RunStatus.COMPLETED)
            assert done.output == 1


async def test_cancel_racing_completion_says_the_run_finished(
    service: RunService, store: RunStore, db_url: str
) -> None:
    run, _ = await service.submit("a", {})
    claimed = (await store.claim_batch(worker_id="w", limit=1, lease_seconds=30))[0]
    with psycopg.connect(db_url) as completer:
        # The completion holds the row while the cancel arrives.
        completer.execute(
            "UPDATE runlane.runs SET status = 'completed', finished_at = now(),"
            " lease_token = NULL, lease_expires_at = NULL, worker_id = NULL WHERE id = %s",
            (run.id,),
        )
        cancel = asyncio.create_task(service.cancel(run.id))
        await asyncio.sleep(0.2)  # the cancel is now waiting on the row lock
        assert not cancel.done()
        completer.commit()
    with pytest.raises(RunFinished):
        await cancel
    assert claimed.id == run.id


async def test_concurrent_requeues_agree(service: RunService, store: RunStore) -> None:
    run, _ = await service.submit("a", {}, max_attempts=1)
    claimed = (await store.claim_batch(worker_id="w", limit=1, lease_seconds=30))[0]
    await store.finish_attempt(run.id, claimed.lease_token, Outcome.FAILED)
    results = await asyncio.gather(
        service.requeue(run.id), service.requeue(run.id), return_exceptions=True
    )
    ok = [r for r in results if not isinstance(r, BaseException)]
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(ok) == 1 and len(errors) == 1
    assert "pending" in str(errors[0])


async def test_emit_keeps_falsy_payloads(service: RunService, settings: Settings) -> None:
    app = App(settings)

    @app.agent("falsy")
    async def falsy(ctx: RunContext) -> Any:
        for value in (0, [], "", False):
            await ctx.emit("value", value)
        return None

    run, _ = await service.submit("falsy", {})
    async with running_worker(app, settings):
        await wait_for_status(service, run.id, RunStatus.COMPLETED)
    assert [e.data for e in await service.events(run.id)] == [0, [], "", False]


def test_an_up_to_date_schema_needs_no_ddl_rights(db_url: str, sql: Conn) -> None:
    role = f"runlane_app_{uuid.uuid4().hex[:8]}"
    dbname = sql.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
    sql.execute(f"CREATE ROLE {role} LOGIN")
    try:
        sql.execute(f'REVOKE CREATE ON DATABASE "{dbname}" FROM PUBLIC, {role}')
        sql.execute(f"GRANT USAGE ON SCHEMA runlane TO {role}")
        sql.execute(f"GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA runlane TO {role}")
        params = psycopg.conninfo.conninfo_to_dict(db_url)
        params["user"] = role
        as_role = psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]
        assert migrate(as_role) == []
    finally:
        sql.execute(f"DROP OWNED BY {role}")
        sql.execute(f"DROP ROLE {role}")


__all__ = ["database_url"]


async def test_errors_and_events_are_redacted_before_they_are_stored(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)

    @app.agent("leaky")
    async def leaky(ctx: RunContext) -> Any:
        await ctx.emit("log", {"line": "calling with Authorization: Bearer abcdefghijklmnop"})
        raise RuntimeError("could not connect to postgresql://app:s3cr3t@db/prod")

    run, _ = await service.submit("leaky", {}, max_attempts=1)
    async with running_worker(app, settings):
        done = await wait_for_status(service, run.id, RunStatus.DEAD)
    assert "s3cr3t" not in str(done.error) and "[redacted]" in done.error["message"]
    events = await service.events(run.id)
    assert "abcdefghijklmnop" not in str(events[0].data)


async def test_a_renewal_that_meets_a_written_outcome_loses_no_lease(
    service: RunService,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A heartbeat tick that reaches the database just after a run's outcome
    committed finds no lease: the run is done, not lost, while its handler's
    task has yet to hear back from the outcome write."""
    app = App(settings)

    @app.agent("quick")
    async def quick(ctx: RunContext) -> Any:
        return "done"

    async with running_worker(app, settings) as worker:
        written, go_on = asyncio.Event(), asyncio.Event()
        write_outcome = worker.completions.finish

        async def finish_then_wait(finish: Any) -> RunStatus | None:
            # The outcome is committed; its answer is held back, as a busy
            # event loop or a slow read of the batch's answer would.
            status = await write_outcome(finish)
            written.set()
            await go_on.wait()
            return status

        monkeypatch.setattr(worker.completions, "finish", finish_then_wait)
        run, _ = await service.submit("quick", {})
        await asyncio.wait_for(written.wait(), 10)
        assert (await service.get(run.id)).status is RunStatus.COMPLETED
        execution = worker.executions[run.id]
        await worker.heartbeat.renew()
        assert execution.stop_reason is None
        assert not execution.context.lease_lost
        go_on.set()
        await wait_until(lambda: run.id not in worker.executions, message="run let go")
        assert execution.final is RunStatus.COMPLETED
        lost = worker.metrics.registry.get_sample_value("runlane_worker_leases_lost_total")
        finished = worker.metrics.registry.get_sample_value(
            "runlane_worker_attempts_finished_total", {"outcome": "completed"}
        )
    assert lost == 0
    assert finished == 1
    assert not [r for r in caplog.records if "lease" in r.getMessage()]


async def test_an_outcome_write_that_finds_another_owner_counts_a_lost_lease(
    service: RunService, settings: Settings, sql: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    # A long heartbeat: only the outcome write can find the lease gone.
    settings = settings.model_copy(update={"heartbeat_seconds": 30.0, "lease_seconds": 90.0})
    app = App(settings)
    started, release = asyncio.Event(), asyncio.Event()

    @app.agent("held")
    async def held(ctx: RunContext) -> Any:
        started.set()
        await release.wait()
        return "mine"

    run, _ = await service.submit("held", {})
    async with running_worker(app, settings) as worker:
        await asyncio.wait_for(started.wait(), 10)
        # Another owner's token, as after a reap and a claim elsewhere.
        sql.execute(
            "UPDATE runlane.runs SET lease_token = gen_random_uuid() WHERE id = %s", (run.id,)
        )
        sql.commit()
        release.set()
        await wait_until(lambda: run.id not in worker.executions, message="run let go")
        lost = worker.metrics.registry.get_sample_value("runlane_worker_leases_lost_total")
    assert lost == 1
    current = await service.get(run.id)
    assert current.status is RunStatus.RUNNING and current.output is None
    assert [r.getMessage() for r in caplog.records if "lease" in r.getMessage()] == [
        f"run {run.id}: lease lost before completed was recorded"
    ]
