"""The lease reaper: a maintenance service that frees expired leases.

Runs in every worker, but the work is done under an advisory lock, so one
process at a time sweeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from runlane.context import TRANSIENT_ERRORS
from runlane.store import RunStore

logger = logging.getLogger(__name__)


class Reaper:
    def __init__(self, store: RunStore, *, interval_seconds: float) -> None:
        self._store = store
        self._interval = interval_seconds
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="runlane-reaper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def sweep(self) -> int:
        """One sweep; returns how many leases it reaped (0 when another
        process holds the lock)."""
        total = 0
        while True:
            reaped = await self._store.reap_expired_leases()
            if not reaped:
                return total
            total += len(reaped)
            for run_id, status in reaped:
                logger.info("reaped expired lease of run %s -> %s", run_id, status)

    async def _run(self) -> None:
        while True:
            try:
                await self.sweep()
            except TRANSIENT_ERRORS as exc:
                logger.warning("reaper sweep failed: %s", exc)
            except Exception:
                # Never let the loop die: a dead reaper strands expired runs.
                logger.exception("reaper sweep failed")
            await asyncio.sleep(self._interval)
