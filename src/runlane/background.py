"""Background tasks of the long-lived services (reaper, listener,
heartbeat, metrics): loops that start() creates and stop() ends."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancels ``tasks`` (None skipped) and waits until each has ended: a
    stopped service leaves nothing running. Their cancellation is the
    expected end, not an error."""
    live = [task for task in tasks if task is not None]
    for task in live:
        task.cancel()
    for task in live:
        with contextlib.suppress(asyncio.CancelledError):
            await task
