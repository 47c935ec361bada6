"""A handler whose process was blocked past the point where the watchdog
gives the lease up goes no further: its next safe point raises LeaseLost
even before the watchdog's next tick has run (after a pause, the handler's
code can run first)."""

from __future__ import annotations

import time
from typing import Any

from runlane import App, RunContext
from runlane.outcomes import LeaseLost
from runlane.service import RunService
from runlane.settings import Settings
from tests.support import running_worker, wait_until


async def test_a_safe_point_after_the_local_lease_clock_ran_out_stops_the_run(
    service: RunService, settings: Settings
) -> None:
    short = settings.model_copy(update={"lease_seconds": 1.0, "heartbeat_seconds": 0.3})
    app = App(short)
    seen: list[str] = []

    @app.agent("paused")
    async def paused(ctx: RunContext) -> Any:
        if ctx.attempt > 1:
            return "later attempt"
        # The whole process stops past 80% of the lease (a blocking call, or
        # a SIGSTOP): no heartbeat and no watchdog tick meanwhile.
        time.sleep(0.9)  # noqa: ASYNC251
        try:
            await ctx.safe_point()  # checks before anything else can run
        except LeaseLost:
            seen.append("lease lost")
            raise
        seen.append("went on")
        return "first attempt"

    run, _ = await service.submit("paused", {})
    async with running_worker(app, short):
        await wait_until(lambda: seen, message="the handler's safe point")
    assert seen == ["lease lost"]
    attempts = await service.store.list_attempts(run.id)
    # Its outcome was not written by the first attempt (the lease is left
    # to expire and be reaped).
    assert attempts[0].outcome in (None, "lease_expired")
