"""Agents for the fault tests, served by ``python -m tests.faults.fault_app``."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from runlane import App, RunContext
from runlane.settings import Settings
from runlane.worker import Worker

app = App()


@app.agent("safe")
async def safe(ctx: RunContext) -> Any:
    """Works in small steps with a safe point between them."""
    steps = int(ctx.input.get("steps", 10_000))
    for step in range(steps):
        await ctx.safe_point()
        await ctx.emit("step", {"step": step})
        await asyncio.sleep(float(ctx.input.get("step_seconds", 0.05)))
    return {"steps": steps, "attempt": ctx.attempt}


@app.agent("stubborn")
async def stubborn(ctx: RunContext) -> Any:
    """Never reaches a safe point."""
    await ctx.emit("started", {})
    await asyncio.sleep(3600)
    return None


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    settings = Settings()
    assert settings.database_url is not None
    worker = Worker(app, settings.database_url, settings=settings, concurrency=4)
    asyncio.run(worker.run_until_signalled())


if __name__ == "__main__":
    main()
