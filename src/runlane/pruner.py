"""Retention: a maintenance service that deletes old finished runs.

Runs in every worker; an advisory lock makes one process at a time prune.
Deletes in small batches, oldest first, so it never holds many locks or
writes a huge transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from runlane.models import RunStatus
from runlane.store import RunStore

logger = logging.getLogger(__name__)


class Pruner:
    def __init__(
        self, store: RunStore, *, retention: dict[str, float], interval_seconds: float
    ) -> None:
        self._store = store
        self._retention = {RunStatus(status): seconds for status, seconds in retention.items()}
        self._interval = interval_seconds
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="runlane-pruner")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def run_once(self) -> tuple[int, int] | None:
        result = await self._store.prune(self._retention, exclusive=True)
        if result and any(result):
            logger.info("pruner: deleted %d runs and %d requests", *result)
        return result

    async def _run(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:
                logger.exception("prune pass failed")
            await asyncio.sleep(self._interval)
