"""The worker runtime end to end, in-process, against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import psycopg

from runlane import App, Fail, Retry, RunContext
from runlane.models import RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from tests.support import running_worker, wait_until

Conn = psycopg.Connection[Any]


async def wait_for_status(
    service: RunService, run_id: Any, *statuses: RunStatus, timeout: float = 15
) -> Any:
    async def reached() -> Any:
        run = await service.get(run_id)
        return run if run.status in statuses else None

    return await wait_until(reached, timeout=timeout, message=f"run in {statuses}")


async def test_handler_output_completes_the_run(service: RunService, settings: Settings) -> None:
    app = App(settings)

    @app.agent("echo")
    async def echo(ctx: RunContext) -> Any:
        await ctx.emit("token", {"text": "hi"})
        return {"echo": ctx.input, "attempt": ctx.attempt}

    run, _ = await service.submit("echo", {"x": 1})
    async with running_worker(app, settings):
        done = await wait_for_status(service, run.id, RunStatus.COMPLETED)
    assert done.output == {"echo": {"x": 1}, "attempt": 1}
    events = await service.events(run.id)
    assert [(e.seq, e.kind, e.data) for e in events] == [(1, "token", {"text": "hi"})]


async def test_a_worker_claims_only_the_agents_it_serves(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)

    @app.agent("mine")
    async def mine(ctx: RunContext) -> Any:
        return "ok"

    other, _ = await service.submit("someone-elses", {})
    own, _ = await service.submit("mine", {})
    async with running_worker(app, settings) as worker:
        await wait_for_status(service, own.id, RunStatus.COMPLETED)
        assert worker.agents == ["mine"]
    assert (await service.get(other.id)).status is RunStatus.PENDING


async def test_unknown_agent_fails_without_retry(service: RunService, settings: Settings) -> None:
    run, _ = await service.submit("nobody", {}, max_attempts=3)
    async with running_worker(App(settings), settings, claim_unknown_agents=True):
        done = await wait_for_status(service, run.id, RunStatus.FAILED)
    assert done.error["code"] == "unknown_agent" and done.attempts == 1


async def test_exception_is_retried_and_checkpoint_carries_over(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)
    seen: list[Any] = []

    @app.agent("flaky")
    async def flaky(ctx: RunContext) -> Any:
        seen.append((ctx.attempt, ctx.checkpoint))
        if ctx.attempt == 1:
            await ctx.save_checkpoint({"turn": 1})
            raise Retry("try again", delay=0)
        return "ok"

    run, _ = await service.submit("flaky", {})
    async with running_worker(app, settings):
        done = await wait_for_status(service, run.id, RunStatus.COMPLETED)
    assert seen == [(1, None), (2, {"turn": 1})]
    attempts = await service.attempts(run.id)
    assert [(a.attempt, a.outcome) for a in attempts] == [(1, "retry"), (2, "completed")]
    assert done.attempts == 2


async def test_failing_handler_goes_dead_after_max_attempts(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)
    calls = 0

    @app.agent("broken")
    async def broken(ctx: RunContext) -> Any:
        nonlocal calls
        calls += 1
        # delay=0 skips the backoff to keep the test quick; backoff timing
        # is tested in test_store.
        raise Retry("boom", delay=0)

    run, _ = await service.submit("broken", {}, max_attempts=3)
    async with running_worker(app, settings):
        done = await wait_for_status(service, run.id, RunStatus.DEAD)
    assert calls == 3 and done.attempts == 3


async def test_an_uncaught_exception_is_retried_with_backoff(
    service: RunService, settings: Settings, sql: Conn
) -> None:
    app = App(settings)

    @app.agent("raises")
    async def raises(ctx: RunContext) -> Any:
        raise ValueError("model said no")

    run, _ = await service.submit("raises", {}, max_attempts=3)

    async def retried() -> Any:
        current = await service.get(run.id)
        return current if current.status is RunStatus.PENDING and current.attempts == 1 else None

    async with running_worker(app, settings):
        after = await wait_until(retried, message="first attempt retried")
    assert after.error["code"] == "exception" and after.error["type"] == "ValueError"
    assert "model said no" in after.error["message"]
    wait = sql.execute(
        "SELECT extract(epoch FROM available_at - now())::float FROM runlane.runs"
    ).fetchone()
    assert wait is not None and 3 < wait[0] <= 5.5


async def test_fail_ends_the_run_failed(service: RunService, settings: Settings) -> None:
    app = App(settings)

    @app.agent("refuses")
    async def refuses(ctx: RunContext) -> Any:
        raise Fail("policy", "not allowed")

    run, _ = await service.submit("refuses", {}, max_attempts=3)
    async with running_worker(app, settings):
        done = await wait_for_status(service, run.id, RunStatus.FAILED)
    assert done.error == {"code": "policy", "message": "not allowed"} and done.attempts == 1


async def test_output_that_is_not_json_fails_the_run(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)

    @app.agent("odd")
    async def odd(ctx: RunContext) -> Any:
        return {1, 2}

    run, _ = await service.submit("odd", {})
    async with running_worker(app, settings):
        done = await wait_for_status(service, run.id, RunStatus.FAILED)
    assert done.error["code"] == "invalid_output"


async def test_cancel_reaches_a_running_handler_through_notify(
    service: RunService, settings: Settings
) -> None:
    # A long heartbeat: only NOTIFY can deliver the cancel this fast.
    settings = settings.model_copy(update={"heartbeat_seconds": 30.0, "lease_seconds": 90.0})
    app = App(settings)
    started = asyncio.Event()

    @app.agent("long")
    async def long(ctx: RunContext) -> Any:
        started.set()
        while True:
            await ctx.safe_point()
            await asyncio.sleep(0.01)

    run, _ = await service.submit("long", {})
    async with running_worker(app, settings):
        await asyncio.wait_for(started.wait(), 10)
        t0 = time.monotonic()
        await service.cancel(run.id)
        done = await wait_for_status(service, run.id, RunStatus.CANCELLED, timeout=5)
        assert time.monotonic() - t0 < 5
    attempts = await service.attempts(run.id)
    assert attempts[-1].outcome == "cancelled" and done.finished_at is not None


async def test_cancel_reaches_a_handler_within_a_heartbeat_without_notify(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)
    started = asyncio.Event()

    @app.agent("long")
    async def long(ctx: RunContext) -> Any:
        started.set()
        await ctx.wait_cancel_requested()
        await ctx.safe_point()

    run, _ = await service.submit("long", {})
    async with running_worker(app, settings, listen=False):
        await asyncio.wait_for(started.wait(), 10)
        await service.cancel(run.id)
        await wait_for_status(
            service, run.id, RunStatus.CANCELLED, timeout=settings.heartbeat_seconds * 4
        )


async def test_handler_ignoring_cancel_is_stopped_after_the_grace(
    service: RunService, settings: Settings
) -> None:
    settings = settings.model_copy(update={"cancel_grace_seconds": 0.5})
    app = App(settings)
    started = asyncio.Event()
    stopped = asyncio.Event()

    @app.agent("stubborn")
    async def stubborn(ctx: RunContext) -> Any:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.set()
            raise

    run, _ = await service.submit("stubborn", {})
    async with running_worker(app, settings):
        await asyncio.wait_for(started.wait(), 10)
        await service.cancel(run.id)
        await wait_for_status(service, run.id, RunStatus.CANCELLED, timeout=10)
    assert stopped.is_set()


async def test_run_that_completes_before_seeing_the_cancel_ends_completed(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)
    started = asyncio.Event()
    proceed = asyncio.Event()

    @app.agent("quick")
    async def quick(ctx: RunContext) -> Any:
        started.set()
        await proceed.wait()
        return "done"  # no safe point after the cancel

    run, _ = await service.submit("quick", {})
    settings = settings.model_copy(update={"cancel_grace_seconds": 30.0})
    async with running_worker(app, settings, listen=False):
        await asyncio.wait_for(started.wait(), 10)
        assert (await service.cancel(run.id)).status is RunStatus.CANCEL_REQUESTED
        proceed.set()
        done = await wait_for_status(service, run.id, RunStatus.COMPLETED, RunStatus.CANCELLED)
    assert done.status is RunStatus.COMPLETED and done.output == "done"


async def test_polling_alone_makes_progress_without_notify(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)

    @app.agent("echo")
    async def echo(ctx: RunContext) -> Any:
        return ctx.input

    service.store.notify = False
    async with running_worker(app, settings, listen=False, notify=False) as worker:
        runs = [(await service.submit("echo", {"i": i}))[0] for i in range(20)]
        for run in runs:
            await wait_for_status(service, run.id, RunStatus.COMPLETED)
        assert worker.wakeups_by_notify == 0


async def test_notify_wakes_an_idle_worker_before_its_poll(
    service: RunService, settings: Settings
) -> None:
    settings = settings.model_copy(update={"poll_seconds": 30.0})
    app = App(settings)

    @app.agent("echo")
    async def echo(ctx: RunContext) -> Any:
        return ctx.input

    async with running_worker(app, settings) as worker:
        assert worker.listener is not None
        await asyncio.wait_for(worker.listener.connected.wait(), 10)
        await asyncio.sleep(0)  # let the claim loop go idle
        # A keyed submit is never pushed to a parked claim, so only its
        # NOTIFY can start it before the 30 s poll.
        run, _ = await service.submit("echo", {}, idempotency_key="k-1")
        await wait_for_status(service, run.id, RunStatus.COMPLETED, timeout=10)
        assert worker.wakeups_by_notify >= 1


async def test_deadline_budget_stops_the_run_at_a_safe_point(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)

    @app.agent("slow")
    async def slow(ctx: RunContext) -> Any:
        while True:
            await ctx.safe_point()
            await asyncio.sleep(0.05)

    run, _ = await service.submit("slow", {}, budget={"max_seconds": 0.5}, max_attempts=3)
    async with running_worker(app, settings):
        done = await wait_for_status(service, run.id, RunStatus.FAILED)
    assert done.error["code"] == "budget_exceeded" and done.attempts == 1


async def test_once_replays_the_recorded_effect_on_a_later_attempt(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)
    sent: list[int] = []

    @app.agent("mailer")
    async def mailer(ctx: RunContext) -> Any:
        async def send() -> dict[str, int]:
            sent.append(ctx.attempt)
            return {"message_id": 100 + ctx.attempt}

        receipt = await ctx.once("send-mail", send)
        if ctx.attempt == 1:
            raise Retry("crash after the effect", delay=0)
        return receipt

    run, _ = await service.submit("mailer", {})
    async with running_worker(app, settings):
        done = await wait_for_status(service, run.id, RunStatus.COMPLETED)
    assert sent == [1] and done.output == {"message_id": 101}


async def test_concurrency_limits_runs_in_flight(service: RunService, settings: Settings) -> None:
    app = App(settings)
    in_flight = 0
    peak = 0

    @app.agent("work")
    async def work(ctx: RunContext) -> Any:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return None

    runs = [(await service.submit("work", {}))[0] for _ in range(30)]
    async with running_worker(app, settings, concurrency=4):
        for run in runs:
            await wait_for_status(service, run.id, RunStatus.COMPLETED)
    assert peak == 4


async def test_max_turns_budget_fails_the_run_without_retry(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)
    model_calls = 0

    @app.agent("chatty")
    async def chatty(ctx: RunContext) -> Any:
        nonlocal model_calls
        while True:
            await ctx.turn()
            model_calls += 1
            await asyncio.sleep(0)

    run, _ = await service.submit("chatty", {}, budget={"max_turns": 3}, max_attempts=3)
    async with running_worker(app, settings):
        done = await wait_for_status(service, run.id, RunStatus.FAILED)
    assert done.error["code"] == "budget_exceeded" and "max_turns" in done.error["message"]
    assert model_calls == 3 and done.attempts == 1 and done.turns == 4


async def test_turns_count_across_attempts(service: RunService, settings: Settings) -> None:
    app = App(settings)

    @app.agent("two-tries")
    async def two_tries(ctx: RunContext) -> Any:
        await ctx.turn()
        if ctx.attempt == 1:
            await ctx.turn()
            raise Retry("model error", delay=0)
        return ctx.turns

    run, _ = await service.submit("two-tries", {}, budget={"max_turns": 3})
    async with running_worker(app, settings):
        done = await wait_for_status(service, run.id, RunStatus.COMPLETED)
    assert done.output == 3


async def test_a_tool_retried_inside_the_handler_uses_no_queue_attempt(
    service: RunService, settings: Settings
) -> None:
    """ "Try again" of a failing tool is the handler's own loop: the run keeps
    its one attempt."""
    app = App(settings)
    tries = 0

    async def flaky_tool() -> str:
        nonlocal tries
        tries += 1
        if tries < 3:
            raise ConnectionError("tool timed out")
        return "tool result"

    @app.agent("tool-user")
    async def tool_user(ctx: RunContext) -> Any:
        for _ in range(5):
            try:
                return await flaky_tool()
            except ConnectionError:
                await ctx.safe_point()
        raise Fail("tool_unavailable")

    run, _ = await service.submit("tool-user", {})
    async with running_worker(app, settings):
        done = await wait_for_status(service, run.id, RunStatus.COMPLETED)
    assert done.output == "tool result" and done.attempts == 1 and tries == 3


async def test_the_worker_reads_times_in_utc_in_any_server_zone(
    service: RunService, settings: Settings, sql: Conn
) -> None:
    # The worker's sessions run in UTC (cheaper times to load): the same
    # instants as a session in the server's zone reads, with offset zero.
    sql.execute("SELECT set_config('TimeZone', 'Asia/Kolkata', false)")
    sql.execute("ALTER DATABASE " + sql.info.dbname + " SET TimeZone = 'Asia/Kolkata'")
    run, _ = await service.submit("clock", {})
    app = App(settings)
    async with running_worker(app, settings) as worker:
        await worker.store.claim_batch(
            worker_id="test", limit=1, lease_seconds=30, agents=["clock"]
        )
        claimed = await worker.store.get_run(run.id)
    row = sql.execute(
        "SELECT created_at, started_at FROM runlane.runs WHERE id = %s", (run.id,)
    ).fetchone()
    assert row is not None and claimed is not None and claimed.started_at is not None
    assert row[0].utcoffset() == timedelta(hours=5, minutes=30)
    assert claimed.created_at.utcoffset() == timedelta(0)
    assert claimed.created_at == row[0]
    assert claimed.started_at == row[1]
