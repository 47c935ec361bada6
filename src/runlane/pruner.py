"""Retention: a maintenance service that deletes old finished runs.

Runs in every worker; an advisory lock makes one process at a time prune.
Deletes in small batches, oldest first, so it never holds many locks or
writes a huge transaction.
"""

from __future__ import annotations

import logging

from runlane.models import RunStatus
from runlane.periodic import PeriodicService
from runlane.store import RunStore

logger = logging.getLogger(__name__)


class Pruner(PeriodicService):
    name = "pruner"

    def __init__(
        self, store: RunStore, *, retention: dict[str, float], interval_seconds: float
    ) -> None:
        super().__init__(interval_seconds=interval_seconds)
        self._store = store
        self._retention = {RunStatus(status): seconds for status, seconds in retention.items()}

    async def run_once(self) -> tuple[int, int] | None:
        result = await self._store.prune(self._retention, exclusive=True)
        if result and any(result):
            logger.info("pruner: deleted %d runs and %d requests", *result)
        return result
