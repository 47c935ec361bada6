"""The operator's view and levers: queue overview, workers, tenant caps,
bulk re-queue, pruning. The CLI and the API's admin routes call these."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runlane.errors import InvalidInput, RunlaneError
from runlane.models import Run, RunStatus
from runlane.service import RunService
from runlane.store import RunStore

MAX_BULK = 10_000


@dataclass(frozen=True, slots=True)
class QueueOverview:
    # (status, agent, tenant) -> count, for pending and running runs
    live: list[dict[str, Any]]
    oldest_pending_seconds: float | None
    dead: int
    workers: list[dict[str, Any]]
    waiting_lanes: list[dict[str, Any]] = field(default_factory=list)


class Operations:
    def __init__(self, runs: RunService) -> None:
        self.runs = runs
        self.store: RunStore = runs.store

    async def overview(self, *, tenant: str | None = None) -> QueueOverview:
        live = [dict(row) for row in await self.store.queue_gauges(tenant=tenant)]
        oldest = [
            row["oldest_pending_seconds"]
            for row in live
            if row["oldest_pending_seconds"] is not None
        ]
        return QueueOverview(
            live=live,
            oldest_pending_seconds=max(oldest) if oldest else None,
            dead=await self.store.dead_count(tenant=tenant),
            workers=await self.workers(),
            waiting_lanes=[dict(r) for r in await self.store.waiting_lanes(tenant=tenant)],
        )

    async def workers(self) -> list[dict[str, Any]]:
        alive_seconds = self.runs.settings.lease_seconds
        return [dict(row) for row in await self.store.list_workers(alive_seconds=alive_seconds)]

    async def set_tenant_cap(self, tenant: str, max_running: int | None) -> None:
        if max_running is not None and max_running < 0:
            raise InvalidInput("max_running must be >= 0 (or unset)")
        if not tenant:
            raise InvalidInput("a tenant is needed")
        await self.store.set_tenant_limit(tenant, max_running)

    async def tenant_caps(self, tenant: str | None = None) -> list[dict[str, Any]]:
        return [dict(row) for row in await self.store.list_tenant_limits(tenant)]

    async def requeue_many(
        self,
        *,
        statuses: Sequence[RunStatus],
        agent: str | None = None,
        tenant: str | None = None,
        limit: int = 1000,
    ) -> tuple[list[Run], list[tuple[Run, str]]]:
        """Re-queues failed/dead runs in bulk. Returns (re-queued, refused
        with the reason) — a lane's run may be refused by its lane."""
        if not 1 <= limit <= MAX_BULK:
            raise InvalidInput(f"limit must be 1-{MAX_BULK}")
        if not set(statuses) <= {RunStatus.FAILED, RunStatus.DEAD}:
            raise InvalidInput("only failed or dead runs can be re-queued")
        done: list[Run] = []
        refused: list[tuple[Run, str]] = []
        candidates = await self.store.list_runs(
            tenant=tenant, statuses=statuses, agent=agent, limit=limit
        )
        for run in candidates:
            try:
                done.append(await self.runs.requeue(run.id))
            except RunlaneError as exc:  # one refusal never stops the batch
                refused.append((run, exc.code))
        return done, refused

    async def prune(self, older_than_seconds: float | None = None) -> tuple[int, int]:
        """Deletes finished runs past retention now (all statuses at
        ``older_than_seconds`` when given)."""
        retention = self.runs.settings.retention()
        if older_than_seconds is not None:
            if older_than_seconds < 0:
                raise InvalidInput("older-than must be >= 0")
            retention = {status: older_than_seconds for status in retention}
        result = await self.store.prune({RunStatus(s): seconds for s, seconds in retention.items()})
        assert result is not None
        return result
