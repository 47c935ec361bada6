"""A maintenance job run every few seconds in the background of a worker.

The reaper, lane recovery and the pruner are each one: start/stop objects
whose loop survives any error (a dead loop would strand work silently).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from runlane.background import cancel_and_wait
from runlane.context import TRANSIENT_ERRORS

logger = logging.getLogger(__name__)


class PeriodicService:
    name = "maintenance"

    def __init__(self, *, interval_seconds: float) -> None:
        self._interval = interval_seconds
        self._task: asyncio.Task[None] | None = None

    async def run_once(self) -> Any:
        raise NotImplementedError

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"runlane-{self.name}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.run_once()
            except TRANSIENT_ERRORS as exc:
                logger.warning("%s pass failed: %r", self.name, exc)
            except Exception:
                logger.exception("%s pass failed", self.name)
            await asyncio.sleep(self._interval)
