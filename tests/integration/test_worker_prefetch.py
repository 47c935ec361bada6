"""Claiming ahead: while its handlers are short and runs are waiting, a
worker claims beyond its free slots as many runs as its slots get through
in about ``prefetch_handler_seconds`` (at least its concurrency, at most
200), each started when a slot frees. Handlers still never exceed the
concurrency; with long handlers, or the setting at 0, nothing is claimed
ahead; a run claimed ahead and cancelled, or still waiting at shutdown,
ends without its handler being called."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runlane import App, RunContext
from runlane.models import RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from runlane.worker import Worker
from tests.support import running_worker, wait_until


async def all_in(service: RunService, run_ids: list[Any], *statuses: RunStatus) -> bool:
    for run_id in run_ids:
        if (await service.get(run_id)).status not in statuses:
            return False
    return True


def claim_sizes(sql: Any) -> list[int]:
    """The runs each claim took: a claim is a transaction of its own, and
    the runs it takes share their start (now())."""
    return [
        count
        for (count,) in sql.execute(
            "SELECT count(*) FROM runlane.runs GROUP BY started_at"
        ).fetchall()
    ]


async def complete_all(
    app: App,
    settings: Settings,
    service: RunService,
    runs: list[Any],
    concurrency: int,
    holder: list[Worker],
) -> None:
    """Runs ``runs`` to completion on one worker, which ``holder`` gives
    the handlers to look at."""
    async with running_worker(app, settings, concurrency=concurrency) as worker:
        holder.append(worker)
        await wait_until(
            lambda: all_in(service, [r.id for r in runs], RunStatus.COMPLETED),
            timeout=60,
            message="every run completed",
        )


async def test_short_handlers_are_claimed_ahead_and_never_exceed_concurrency(
    service: RunService, settings: Settings
) -> None:
    # Handlers of 20 ms, well above a claim's round trip even on a loaded
    # machine, so that a claim sent ahead comes back while they run; the
    # setting at five times that, so that claiming ahead is on and three
    # slots get through at most 15 runs in its time.
    settings = settings.model_copy(update={"prefetch_handler_seconds": 0.1})
    app = App(settings)
    holder: list[Worker] = []
    calls: list[int] = []
    in_flight = peak = peak_prefetched = 0

    @app.agent("quick")
    async def quick(ctx: RunContext) -> Any:
        nonlocal in_flight, peak, peak_prefetched
        in_flight += 1
        peak = max(peak, in_flight)
        peak_prefetched = max(peak_prefetched, holder[0].prefetched)
        calls.append(ctx.input["n"])
        await asyncio.sleep(0.02)
        in_flight -= 1
        return ctx.input["n"]

    runs = [(await service.submit("quick", {"n": i}))[0] for i in range(60)]
    await complete_all(app, settings, service, runs, 3, holder)
    assert peak == 3
    # More than the concurrency ahead (the handlers are 5 times shorter
    # than the setting), never more than the slots get through in it.
    assert peak_prefetched > 3, f"claimed ahead at most {peak_prefetched}"
    assert peak_prefetched <= 15
    assert sorted(calls) == list(range(60)), "each handler ran exactly once"
    assert {(await service.get(r.id)).attempts for r in runs} == {1}


async def test_a_claim_ahead_takes_the_free_slots_and_the_runs_ahead_at_once(
    service: RunService, settings: Settings, sql: Any
) -> None:
    # Each claim is a transaction of its own, and the runs it takes share
    # their start (now()): the largest group of runs started at one
    # instant is the largest claim. Claiming ahead with three slots and
    # handlers of a fifth of the setting, one claim takes more than six
    # runs (the slots and the runs ahead together, not a statement each),
    # and never more than the slots and the 15 runs they get through in
    # the setting's time.
    settings = settings.model_copy(update={"prefetch_handler_seconds": 0.1})
    app = App(settings)
    holder: list[Worker] = []

    @app.agent("quick")
    async def quick(ctx: RunContext) -> Any:
        await asyncio.sleep(0.02)
        return None

    runs = [(await service.submit("quick", {"n": i}))[0] for i in range(60)]
    await complete_all(app, settings, service, runs, 3, holder)
    sizes = claim_sizes(sql)
    assert sum(sizes) == 60
    assert max(sizes) > 6, f"no claim took more than twice the concurrency: {sorted(sizes)}"
    assert max(sizes) <= 3 + 15


async def test_with_handlers_far_shorter_than_the_setting_claims_take_up_to_200_runs(
    service: RunService, settings: Settings, sql: Any
) -> None:
    # Handlers that return at once: two slots get through thousands of
    # runs in the setting's 20 ms, so a claim takes up to 200 of them (the
    # cap), spreading each claim's and each outcome batch's fixed cost,
    # while no more than two handlers run at once.
    settings = settings.model_copy(update={"prefetch_handler_seconds": 0.02})
    app = App(settings)
    holder: list[Worker] = []
    in_flight = peak = 0

    @app.agent("instant")
    async def instant(ctx: RunContext) -> Any:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)
        in_flight -= 1
        return None

    runs = [(await service.submit("instant", {}))[0] for _ in range(600)]
    await complete_all(app, settings, service, runs, 2, holder)
    sizes = claim_sizes(sql)
    assert sum(sizes) == 600
    assert peak <= 2
    assert max(sizes) > 100, f"claims stayed small: {sorted(sizes)}"
    assert max(sizes) <= 200
    assert {(await service.get(r.id)).attempts for r in runs} == {1}


@pytest.mark.parametrize(
    ("handler_seconds", "prefetch_below"),
    [(0.05, 0.02), (0.0, 0.0)],
    ids=["handlers-longer-than-the-setting", "setting-off"],
)
async def test_nothing_is_claimed_ahead_for_long_handlers_or_with_the_setting_off(
    service: RunService, settings: Settings, handler_seconds: float, prefetch_below: float
) -> None:
    settings = settings.model_copy(update={"prefetch_handler_seconds": prefetch_below})
    app = App(settings)
    holder: list[Worker] = []
    peak_prefetched = 0
    peak_held = 0

    @app.agent("work")
    async def work(ctx: RunContext) -> Any:
        nonlocal peak_prefetched, peak_held
        peak_prefetched = max(peak_prefetched, holder[0].prefetched)
        peak_held = max(peak_held, len(holder[0].executions))
        await asyncio.sleep(handler_seconds)
        return None

    runs = [(await service.submit("work", {}))[0] for _ in range(40)]
    await complete_all(app, settings, service, runs, 2, holder)
    assert peak_prefetched == 0
    # The handlers running and the outcomes waiting to be written.
    assert peak_held <= 2 * 2


async def test_a_run_cancelled_while_claimed_ahead_ends_without_its_handler(
    service: RunService, settings: Settings
) -> None:
    app = App(settings)
    holder: list[Worker] = []
    may_return = asyncio.Event()
    called: list[str] = []

    @app.agent("quick")
    async def quick(ctx: RunContext) -> Any:
        called.append(ctx.input["name"])
        return None

    @app.agent("hold")
    async def hold(ctx: RunContext) -> Any:
        called.append("hold")
        await may_return.wait()
        return None

    warmup = [(await service.submit("quick", {"name": f"w{i}"}))[0] for i in range(20)]
    held = (await service.submit("hold", {}))[0]
    victim = (await service.submit("quick", {"name": "victim"}))[0]
    after = [(await service.submit("quick", {"name": f"a{i}"}))[0] for i in range(3)]
    async with running_worker(app, settings, concurrency=1) as worker:
        holder.append(worker)

        def victim_waits_behind_hold() -> bool:
            # Claimed ahead, possibly with the warm-up runs before "hold"
            # (a claim takes many runs ahead of short handlers): it waits
            # for the slot that "hold" now takes.
            execution = worker.executions.get(victim.id)
            return "hold" in called and execution is not None and execution in worker._prefetched

        await wait_until(victim_waits_behind_hold, timeout=30, message="the run claimed ahead")
        await service.cancel(victim.id)
        cancelled = await wait_until(
            lambda: all_in(service, [victim.id], RunStatus.CANCELLED),
            timeout=15,
            message="the run claimed ahead cancelled",
        )
        assert cancelled
        # Cancelled while the handler before it still runs: it never started.
        assert (await service.get(held.id)).status == RunStatus.RUNNING
        may_return.set()
        await wait_until(
            lambda: all_in(service, [r.id for r in [*warmup, held, *after]], RunStatus.COMPLETED),
            timeout=30,
            message="the other runs completed",
        )
    assert "victim" not in called


@pytest.mark.parametrize("grace", [5.0, 0.0], ids=["within-the-grace", "no-grace"])
async def test_runs_claimed_ahead_at_shutdown_run_in_the_grace_or_are_released_unstarted(
    service: RunService, settings: Settings, grace: float
) -> None:
    """Both handler slots are taken by handlers that wait for a gate, with
    runs claimed ahead behind them; then the worker stops. With a grace
    period the gate opens during the stop: the runs claimed ahead start
    and complete. Without one, they are released without their handler
    having been called."""
    app = App(settings)
    holder: list[Worker] = []
    gate = asyncio.Event()
    called: set[Any] = set()
    blocked = 0

    @app.agent("work")
    async def work(ctx: RunContext) -> Any:
        nonlocal blocked
        called.add(ctx.run_id)
        if holder[0].prefetched or gate.is_set() or blocked:
            blocked += 1
            await gate.wait()
        else:
            await asyncio.sleep(0.001)
        return None

    runs = [(await service.submit("work", {}))[0] for _ in range(200)]
    worker = Worker(app, settings.database_url or "", settings=settings, concurrency=2)
    holder.append(worker)
    await worker.start()
    stopping: asyncio.Task[None] | None = None
    try:
        await wait_until(
            lambda: worker.handlers_running == 2 and blocked == 2 and worker.prefetched > 0,
            timeout=30,
            message="both slots held, runs claimed ahead",
        )
        waiting = [execution.run_id for execution in worker._prefetched]
        stopping = asyncio.create_task(worker.stop(grace_seconds=grace))
        await wait_until(lambda: worker._stopping, message="the stop began")
        if grace:
            gate.set()
    finally:
        gate.set()
        await (stopping if stopping is not None else worker.stop(grace_seconds=grace))
    states = [await service.get(r.id) for r in runs]
    assert not [s for s in states if s.status not in (RunStatus.COMPLETED, RunStatus.PENDING)]
    if grace:
        for run_id in waiting:
            assert (await service.get(run_id)).status == RunStatus.COMPLETED
            assert run_id in called
        # Only runs never claimed are left, none released with an attempt.
        assert {s.attempts for s in states if s.status == RunStatus.PENDING} <= {0}
    else:
        for run_id in waiting:
            run = await service.get(run_id)
            assert run.status == RunStatus.PENDING
            assert run_id not in called
            assert run.error is not None
            assert run.error["message"] == "worker shut down before the run's handler started"
