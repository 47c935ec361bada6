"""A worker's concurrency slot frees when the handler ends, before its
outcome is written: the handlers running stay within ``concurrency``; the
runs held within the handlers, the runs claimed ahead and at most as many
outcomes waiting as the larger of those two numbers; and a run whose
outcome waits keeps its lease renewed."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psycopg
import pytest

from runlane import App, RunContext
from runlane.execution import StopReason
from runlane.lane_service import LaneService
from runlane.models import RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import RunStore
from runlane.worker import Worker
from tests.integration.lane_helpers import AGENT, submit
from tests.support import running_worker, wait_until


@pytest.mark.parametrize(
    ("handler_seconds", "prefetch_handler_seconds", "most_held"),
    [
        # Nothing claimed ahead: 3 handlers and at most 3 outcomes waiting.
        (0.0, 0.0, 3 + 3),
        # Handlers of a fifth of the setting: up to 15 runs claimed ahead
        # (what 3 slots get through in its time), as many outcomes waiting.
        (0.02, 0.1, 3 + 15 + 15),
    ],
    ids=["not-claiming-ahead", "claiming-ahead"],
)
async def test_handlers_never_exceed_concurrency_and_held_runs_stay_bounded(
    service: RunService,
    lanes: LaneService,
    settings: Settings,
    handler_seconds: float,
    prefetch_handler_seconds: float,
    most_held: int,
) -> None:
    settings = settings.model_copy(update={"prefetch_handler_seconds": prefetch_handler_seconds})
    app = App(settings)
    holder: list[Worker] = []
    in_flight = peak = peak_held = peak_slots = 0

    @app.agent(AGENT)
    async def work(ctx: RunContext) -> Any:
        nonlocal in_flight, peak, peak_held, peak_slots
        in_flight += 1
        peak = max(peak, in_flight)
        peak_held = max(peak_held, len(holder[0].executions))
        peak_slots = max(peak_slots, holder[0].handlers_running)
        for _ in range(3):
            await asyncio.sleep(0)
        await asyncio.sleep(handler_seconds)
        in_flight -= 1
        return {"n": ctx.input.get("n")}

    direct = [(await service.submit(AGENT, {"n": i}))[0] for i in range(60)]
    for lane in range(10):
        for k in range(3):
            await submit(lanes, f"t{lane}", f"{lane}-{k}")
    async with running_worker(app, settings, concurrency=3) as worker:
        holder.append(worker)

        async def all_done() -> bool:
            counts = await service.store.count_runs_by_status()
            return counts.get(RunStatus.COMPLETED, 0) == len(direct) + 30

        await wait_until(all_done, timeout=60, message="every run completed")
        assert worker.handlers_running == 0
    assert peak == 3 and peak_slots == 3
    # Handlers, outcomes waiting to be written, and runs claimed ahead.
    assert peak_held <= most_held


async def test_a_run_whose_outcome_waits_keeps_its_lease_and_frees_its_slot(
    service: RunService, lanes: LaneService, settings: Settings, db_url: str
) -> None:
    """The outcome of a lane's run waits for its lane's lock (held here by
    another transaction): meanwhile the handler's slot is free, the run is
    still held, and the heartbeat keeps renewing its lease; once the lock
    goes, the outcome is written and the lane relays."""
    app = App(settings)
    may_return = asyncio.Event()
    started: list[str] = []

    @app.agent(AGENT)
    async def work(ctx: RunContext) -> Any:
        started.append(ctx.input["text"])
        if ctx.input["text"] == "first":
            await may_return.wait()
        return ctx.input["text"]

    first = await submit(lanes, "t", "first")
    await submit(lanes, "t", "second")
    assert first.run_id is not None
    async with (
        await psycopg.AsyncConnection.connect(db_url, autocommit=True) as blocker,
        running_worker(app, settings, concurrency=2) as worker,
    ):
        await wait_until(lambda: started == ["first"], message="the first run started")

        async def lease_expiry() -> Any:
            cur = await blocker.execute(
                "SELECT lease_expires_at FROM runlane.runs WHERE id = %s AND status = 'running'",
                (first.run_id,),
            )
            row = await cur.fetchone()
            assert row is not None, "the run is no longer running"
            return row[0]

        async with blocker.transaction():
            await blocker.execute(
                "SELECT id FROM runlane.lanes WHERE id = %s FOR UPDATE", (first.lane_id,)
            )
            before = await lease_expiry()
            may_return.set()
            await wait_until(
                lambda: worker.handlers_running == 0, message="the handler's slot freed"
            )
            assert first.run_id in worker.executions  # its outcome is on its way
            # Two heartbeats later the lease has moved on, the outcome still waiting.
            renewals = worker.metrics.renewals._value.get()
            await wait_until(
                lambda: worker.metrics.renewals._value.get() >= renewals + 2,
                timeout=10,
                message="two more renewals",
            )
            assert await lease_expiry() > before
            assert first.run_id in worker.executions
        # The lock is gone: the outcome is written and the lane relays.
        await wait_until(lambda: started == ["first", "second"], message="the relay")

        async def first_completed() -> bool:
            return (await service.get(first.run_id)).status is RunStatus.COMPLETED

        await wait_until(first_completed, message="the first run completed")
    assert worker.heartbeat.failures == 0


async def test_a_handler_cancelled_by_its_own_code_is_retried(
    service: RunService, settings: Settings, store: RunStore
) -> None:
    """The handler runs in the attempt's own task: a CancelledError that
    the worker did not send (a sub-task of the handler's, cancelled) is an
    ordinary failure, retried with backoff."""
    app = App(settings)

    @app.agent(AGENT)
    async def work(ctx: RunContext) -> Any:
        inner = asyncio.ensure_future(asyncio.sleep(3600))
        asyncio.get_running_loop().call_soon(inner.cancel)
        await inner
        return "unreachable"

    run, _ = await service.submit(AGENT, {}, max_attempts=3)
    async with running_worker(app, settings):

        async def first_attempt_ended() -> Any:
            attempts = await store.list_attempts(run.id)
            return attempts if attempts and attempts[0].ended_at is not None else None

        attempts = await wait_until(first_attempt_ended, message="the first attempt ended")
    assert attempts[0].outcome == "retry"
    assert attempts[0].error is not None and attempts[0].error["type"] == "CancelledError"
    after = await service.get(run.id)
    assert after.status is RunStatus.PENDING and after.error["code"] == "exception"


async def test_a_handler_that_swallows_the_workers_stop_still_ends_its_run(
    service: RunService, settings: Settings
) -> None:
    """stop() cancels the attempt's task while the handler runs; a handler
    that catches that and returns ends the run with its output, and the
    worker goes on serving runs."""
    app = App(settings)
    started = asyncio.Event()

    @app.agent(AGENT)
    async def work(ctx: RunContext) -> Any:
        if ctx.input.get("hold"):
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                return "swallowed"
        return "next"

    held, _ = await service.submit(AGENT, {"hold": True})
    async with running_worker(app, settings) as worker:
        await asyncio.wait_for(started.wait(), timeout=10)
        worker.executions[held.id].stop(StopReason.CANCELLED)

        async def ended(run_id: Any) -> Any:
            run = await service.get(run_id)
            return run if run.status is RunStatus.COMPLETED else None

        done = await wait_until(lambda: ended(held.id), message="the held run ended")
        later, _ = await service.submit(AGENT, {})
        after = await wait_until(lambda: ended(later.id), message="the next run ended")
    assert done.output == "swallowed" and after.output == "next"


async def test_a_handler_that_cancels_itself_and_returns_completes(
    service: RunService, settings: Settings
) -> None:
    """Code in the handler that cancels the current task and catches the
    CancelledError without uncancel() (a hand-made timeout, older timeout
    libraries) leaves the task's cancel count raised: the handler's return
    value still counts, the run completes (found by review: the outcome was
    dropped and the run executed again after its lease expired)."""
    app = App(settings)

    @app.agent(AGENT)
    async def work(ctx: RunContext) -> Any:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_soon(task.cancel)
        with contextlib.suppress(asyncio.CancelledError):  # a timeout of its own
            await asyncio.sleep(3600)
        return {"ok": True}

    run, _ = await service.submit(AGENT, {}, max_attempts=3)
    async with running_worker(app, settings):

        async def ended() -> Any:
            now = await service.get(run.id)
            return now if now.status not in (RunStatus.PENDING, RunStatus.RUNNING) else None

        done = await wait_until(ended, timeout=20, message="the run ended")
    assert done.status is RunStatus.COMPLETED and done.output == {"ok": True}
    assert done.attempts == 1
