"""The lease reaper: a maintenance service that frees expired leases.

Runs in every worker, but the work is done under an advisory lock, so one
process at a time sweeps.
"""

from __future__ import annotations

import logging

from runlane.periodic import PeriodicService
from runlane.store import RunStore

logger = logging.getLogger(__name__)


class Reaper(PeriodicService):
    name = "reaper"

    def __init__(self, store: RunStore, *, interval_seconds: float) -> None:
        super().__init__(interval_seconds=interval_seconds)
        self._store = store

    async def run_once(self) -> int:
        return await self.sweep()

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
