"""A small App for the CLI tests: ``runlane worker tests.acceptance.example_app:app``."""

from __future__ import annotations

import asyncio
from typing import Any

import runlane

app = runlane.App()


@app.agent("echo")
async def echo(ctx: runlane.RunContext) -> dict[str, Any]:
    """Emits one event per input key, then returns the input."""
    for key in sorted(ctx.input) if isinstance(ctx.input, dict) else []:
        await ctx.emit("key", {"key": key})
    return {"echo": ctx.input, "attempt": ctx.attempt}


@app.agent("fail")
async def fail(ctx: runlane.RunContext) -> None:
    """Fails for good (never retried)."""
    await ctx.emit("about-to-fail", {"attempt": ctx.attempt})
    raise runlane.Fail("bad_request", "this agent always fails")


@app.agent("wait-for-cancel")
async def wait_for_cancel(ctx: runlane.RunContext) -> None:
    """Works until a cancel request reaches it."""
    await ctx.emit("started")
    while True:
        await ctx.safe_point()
        await asyncio.sleep(0.05)
