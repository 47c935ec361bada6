"""Lane recovery: a maintenance service that converges lanes.

Dispatches the head of idle lanes with queued requests and expires
unanswered interrupts. Runs in every worker; an advisory lock makes one
process at a time do each pass. (Expired leases of lanes' runs are the
reaper's: it re-queues or ends them under their lane's lock, and the relay
trigger does the rest.)
"""

from __future__ import annotations

import logging

from runlane.lane_store import LaneStore, RecoveryResult
from runlane.periodic import PeriodicService

logger = logging.getLogger(__name__)


class Recovery(PeriodicService):
    name = "recovery"

    def __init__(self, lanes: LaneStore, *, interval_seconds: float) -> None:
        super().__init__(interval_seconds=interval_seconds)
        self._lanes = lanes

    async def run_once(self) -> RecoveryResult | None:
        result = await self._lanes.recover()
        if result and (result.dispatched or result.interrupts_expired):
            logger.info(
                "recovery: dispatched %d lane heads, expired %d interrupts",
                result.dispatched,
                result.interrupts_expired,
            )
        return result
