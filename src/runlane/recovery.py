"""Lane recovery: a maintenance service that converges lanes.

Dispatches the head of idle lanes with queued requests and expires
unanswered interrupts. Runs in every worker; an advisory lock makes one
process at a time do each pass. (Expired leases of lanes' runs are the
reaper's: it re-queues or ends them under their lane's lock, and the relay
trigger does the rest.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from runlane.context import TRANSIENT_ERRORS
from runlane.lane_store import LaneStore, RecoveryResult

logger = logging.getLogger(__name__)


class Recovery:
    def __init__(self, lanes: LaneStore, *, interval_seconds: float) -> None:
        self._lanes = lanes
        self._interval = interval_seconds
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="runlane-recovery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run_once(self) -> RecoveryResult | None:
        result = await self._lanes.recover()
        if result and (result.dispatched or result.interrupts_expired):
            logger.info(
                "recovery: dispatched %d lane heads, expired %d interrupts",
                result.dispatched,
                result.interrupts_expired,
            )
        return result

    async def _run(self) -> None:
        while True:
            try:
                await self.run_once()
            except TRANSIENT_ERRORS as exc:
                logger.warning("recovery pass failed: %s", exc)
            except Exception:
                logger.exception("recovery pass failed")
            await asyncio.sleep(self._interval)
