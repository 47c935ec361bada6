"""Lease renewal and the local watchdog of a worker.

One statement per tick renews every lease the worker holds; its answer says
which leases are lost and which runs have a cancel request (DESIGN.md §4).
The watchdog stops a run's work when its lease could not be renewed in time,
by the local monotonic clock, before the database can let it expire
(DESIGN.md §3.4). A failed renewal is retried quickly and kills nothing by
itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from uuid import UUID

from runlane.background import cancel_and_wait
from runlane.context import TRANSIENT_ERRORS
from runlane.execution import Execution, StopReason
from runlane.models import LeaseState, RunStatus
from runlane.store import RunStore, WorkerIdentity
from runlane.worker_metrics import WorkerMetrics

logger = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        store: RunStore,
        executions: Mapping[UUID, Execution],
        *,
        lease_seconds: float,
        interval_seconds: float,
        on_cancel_requested: Callable[[Execution], None],
        on_steer_requested: Callable[[Execution], None],
        worker: Callable[[], WorkerIdentity] | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._metrics = metrics
        self._worker = worker
        self._store = store
        self._executions = executions
        self._lease_seconds = lease_seconds
        self._interval = interval_seconds
        self._on_cancel_requested = on_cancel_requested
        self._on_steer_requested = on_steer_requested
        self._tasks: list[asyncio.Task[None]] = []
        # Renewals given up on but not yet finished (see renew()).
        self._abandoned: set[asyncio.Task[dict[UUID, LeaseState]]] = set()
        self.ticks = 0
        self.failures = 0

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._renew_loop(), name="runlane-heartbeat"),
            asyncio.create_task(self._watchdog_loop(), name="runlane-watchdog"),
        ]

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        for renewal in list(self._abandoned):
            with contextlib.suppress(BaseException):
                await renewal

    async def renew(self) -> None:
        """One tick: renews every held lease in one statement."""
        held = [e for e in self._executions.values() if not e.context.lease_lost]
        sent_at = time.monotonic()
        renewal = asyncio.create_task(
            self._store.renew_leases(
                [(e.run_id, e.lease_token) for e in held],
                lease_seconds=self._lease_seconds,
                worker=self._worker() if self._worker else None,
            )
        )
        done, _ = await asyncio.wait({renewal}, timeout=self._interval)
        if not done:
            # Over a cut connection, cancelling a query can itself hang for a
            # while (the driver tries to cancel it on the server). Let that
            # finish in the background; the next tick tries a new connection.
            renewal.cancel()
            self._abandoned.add(renewal)
            renewal.add_done_callback(self._abandoned.discard)
            raise TimeoutError("lease renewal timed out")
        alive = renewal.result()
        self.ticks += 1
        for execution in held:
            state = alive.get(execution.run_id)
            if state is None:
                # Once its outcome is being written (or written), a run's
                # lease gone is most often that outcome's own commit, met
                # before the write's answer was read: the fenced write
                # tells a loss apart, and says it (Execution._finish).
                if not execution.writing_outcome:
                    logger.warning(
                        "run %s: lease lost (another owner, or expired)", execution.run_id
                    )
                    execution.stop(StopReason.LEASE_LOST)
                    if self._metrics is not None:
                        self._metrics.leases_lost.inc()
                continue
            if not state.renewed:
                continue  # the row was busy; the next tick tries again
            execution.lease.renewed(sent_at)
            if self._metrics is not None:
                self._metrics.renewals.inc()
            if state.status is RunStatus.CANCEL_REQUESTED:
                self._on_cancel_requested(execution)
            if state.steer_requested:
                self._on_steer_requested(execution)

    async def _renew_loop(self) -> None:
        # After a failure, try again soon: the lease is still good for a while.
        retry_after = min(1.0, self._interval / 3)
        while True:
            try:
                await self.renew()
            except Exception as exc:
                # Any failure (a connection cut, a read-only failover, a bug)
                # is retried soon; the watchdog alone decides to stop runs.
                self.failures += 1
                if self._metrics is not None:
                    self._metrics.heartbeat_failures.inc()
                if isinstance(exc, TRANSIENT_ERRORS):
                    logger.warning("heartbeat failed (%r); retrying in %.1fs", exc, retry_after)
                else:
                    logger.exception("heartbeat failed; retrying in %.1fs", retry_after)
                await asyncio.sleep(retry_after)
                continue
            await asyncio.sleep(self._interval)

    async def _watchdog_loop(self) -> None:
        period = min(0.25, self._lease_seconds / 20)
        while True:
            for execution in list(self._executions.values()):
                if not execution.context.lease_lost and execution.lease.expired():
                    logger.warning(
                        "run %s: lease not renewed in time; stopping its work", execution.run_id
                    )
                    execution.stop(StopReason.LEASE_LOST)
                    if self._metrics is not None:
                        self._metrics.leases_lost.inc()
            await asyncio.sleep(period)
