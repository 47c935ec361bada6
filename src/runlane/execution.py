"""One attempt of one run inside a worker: call the handler, stop it when
told to, and write its outcome fenced by the lease token."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import psycopg

from runlane.context import TRANSIENT_ERRORS, LeaseClock, RunContext
from runlane.json_values import json_problem
from runlane.models import ClaimedRun, Outcome, RunStatus
from runlane.outcomes import (
    BudgetExceeded,
    Fail,
    Interrupted,
    LeaseLost,
    Retry,
    RunCancelled,
    ShutdownRequested,
    Steered,
    StopRun,
)
from runlane.redaction import redact
from runlane.store import Finish, RunStore

if TYPE_CHECKING:
    from runlane.completions import CompletionBatcher
    from runlane.event_batches import EventBatcher
    from runlane.worker_metrics import WorkerMetrics

logger = logging.getLogger(__name__)

Handler = Callable[[RunContext], Coroutine[Any, Any, Any]]


class StopReason(enum.StrEnum):
    """Why the worker stopped a handler's task from outside."""

    LEASE_LOST = "lease_lost"
    CANCELLED = "cancelled"
    SHUTDOWN = "shutdown"


class Execution:
    """A claimed run being worked on by this process."""

    def __init__(
        self,
        claimed: ClaimedRun,
        handler: Handler | None,
        store: RunStore,
        *,
        lease_seconds: float,
        claim_sent_at: float,
        metrics: WorkerMetrics | None = None,
        completions: CompletionBatcher | None = None,
        events: EventBatcher | None = None,
        on_handler_end: Callable[[float], None] | None = None,
    ) -> None:
        self._metrics = metrics
        self._completions = completions
        self.claimed = claimed
        self.run_id = claimed.id
        self.lease = LeaseClock(lease_seconds)
        self.lease.renewed(claim_sent_at)
        self.context = RunContext(claimed, store, self.lease, events=events)
        self._handler = handler
        self._store = store
        # The handler runs in the attempt's own task (no second task per
        # run): stop() cancels that task only while the handler runs in it,
        # and counts its cancellations so that run() tells them from a
        # cancellation of the task from outside (the event loop going away).
        # Its creator may set it (the worker does), else run() looks it up.
        self.task: asyncio.Task[Any] | None = None
        self._in_handler = False
        self._stop_cancels = 0
        self._on_handler_end = on_handler_end
        self.handler_ended = False
        self.stop_reason: StopReason | None = None
        # The run's status once its outcome is written; None while it is
        # not, or when the lease was lost before it could be.
        self.final: RunStatus | None = None
        # From the first outcome write on: the fenced write then tells
        # whether the lease still held, and a heartbeat that finds no
        # lease may only have met the outcome's commit (see Heartbeat.renew).
        self.writing_outcome = False
        self._timers: list[asyncio.TimerHandle] = []

    @property
    def lease_token(self) -> Any:
        return self.claimed.lease_token

    def stop(self, reason: StopReason) -> None:
        """Stops the handler's work now (it sees CancelledError). Once the
        handler has ended, its outcome is being written: that is never
        cancelled (it is fenced, and the lease may still be held)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        if reason is StopReason.LEASE_LOST:
            self.context.mark_lease_lost()
        task = self.task
        if (
            self._in_handler
            and task is not None
            and not task.done()
            # Called from the handler itself: it sees the flags at its next
            # safe point (a cancel could land in the outcome write instead).
            and task is not asyncio.current_task()
        ):
            self._stop_cancels += 1
            task.cancel(msg=f"runlane: {reason}")

    def stop_after(self, seconds: float, reason: StopReason) -> None:
        """Stops the handler after ``seconds`` unless it has ended by then."""
        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_later(seconds, self.stop, reason))

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self._end_handler(0.0)

    def _end_handler(self, seconds: float) -> None:
        """The handler is over (returned, raised, or never ran) after
        ``seconds``: frees the worker's concurrency slot, once; the outcome
        may still be written."""
        self._in_handler = False
        if self.handler_ended:
            return
        self.handler_ended = True
        if self._on_handler_end is not None:
            self._on_handler_end(seconds)

    async def run(self) -> None:
        """Runs the attempt to its end; never raises for the handler's sake."""
        claimed = self.claimed
        if self.stop_reason is not None:
            # Stopped before its handler began (a run claimed ahead that
            # waited for a slot): the handler is not called at all.
            self._end_handler(0.0)
            await self._after_stop(handler_started=False)
            return
        if self._handler is None:
            self._end_handler(0.0)
            await self._finish(
                Outcome.FAILED,
                error={"code": "unknown_agent", "message": f"no agent named {claimed.agent!r}"},
            )
            return
        task = self.task or asyncio.current_task()
        assert task is not None
        self.task = task
        started = time.monotonic()
        self._in_handler = True
        try:
            result = await self._handler(self.context)
        except BaseException as exc:
            self._handler_done(claimed.agent, started)
            self._raise_if_cancelled_from_outside(task, exc)
            self._uncancel(task)
            if isinstance(exc, asyncio.CancelledError):
                if self.stop_reason is not None:
                    await self._after_stop()
                    return
                # The handler's own code was cancelled (say, a sub-task it
                # awaited): an ordinary failure, retried with backoff.
            elif not isinstance(exc, Exception | StopRun):
                raise  # KeyboardInterrupt, SystemExit
            await self._ended_by(exc)
            return
        self._handler_done(claimed.agent, started)
        # The handler returned: its result is written, whatever cancels it
        # caught on the way (a stop() it swallowed, or its own code that
        # cancelled this task without uncancel(), as hand-made timeouts
        # do). Only the stops' cancellations are ours to take back.
        self._uncancel(task)
        problem = json_problem(result)
        if problem is not None:
            await self._finish(
                Outcome.FAILED,
                error={"code": "invalid_output", "message": f"output cannot be stored: {problem}"},
            )
        else:
            await self._finish(Outcome.COMPLETED, output=result)

    def _handler_done(self, agent: str, started: float) -> None:
        seconds = time.monotonic() - started
        if self._metrics is not None:
            self._metrics.observe_handler(agent, seconds)
        self._end_handler(seconds)

    def _raise_if_cancelled_from_outside(self, task: asyncio.Task[Any], exc: BaseException) -> None:
        """A CancelledError out of the handler while the attempt's task was
        cancelled by someone other than stop() (the event loop going away):
        the attempt ends here, its outcome unwritten; the lease expires and
        is reaped."""
        if isinstance(exc, asyncio.CancelledError) and task.cancelling() > self._stop_cancels:
            raise exc

    def _uncancel(self, task: asyncio.Task[Any]) -> None:
        for _ in range(self._stop_cancels):
            task.uncancel()
        self._stop_cancels = 0

    async def _ended_by(self, exc: BaseException) -> None:
        """Writes the outcome of a handler that raised ``exc``."""
        if isinstance(exc, Retry):
            await self._finish(
                Outcome.RETRY,
                error={"code": "retry_requested", "message": str(exc)},
                retry_delay_seconds=exc.delay,
            )
        elif isinstance(exc, Fail):
            await self._finish(Outcome.FAILED, error={"code": exc.code, "message": exc.message})
        elif isinstance(exc, RunCancelled):
            await self._finish(Outcome.CANCELLED)
        elif isinstance(exc, Steered):
            await self._finish(Outcome.STEERED)
        elif isinstance(exc, Interrupted):
            await self._finish(
                Outcome.INTERRUPTED, interrupt=exc.payload, interrupt_expires_in=exc.expires_in
            )
        elif isinstance(exc, BudgetExceeded):
            await self._finish(
                Outcome.FAILED,
                error={"code": "budget_exceeded", "message": f"budget exceeded: {exc.what}"},
            )
        elif isinstance(exc, ShutdownRequested):
            await self._finish(
                Outcome.RELEASED,
                error={"code": "released", "message": "worker shut down at a safe point"},
            )
        elif isinstance(exc, LeaseLost):
            logger.warning("run %s: lease lost; its work stopped", self.run_id)
        else:
            await self._finish(Outcome.RETRY, error=_exception_error(exc))

    async def _after_stop(self, *, handler_started: bool = True) -> None:
        if self.stop_reason is StopReason.LEASE_LOST:
            logger.warning("run %s: lease could not be renewed; its work stopped", self.run_id)
        elif self.stop_reason is StopReason.CANCELLED:
            await self._finish(Outcome.CANCELLED)
        elif self.stop_reason is StopReason.SHUTDOWN:
            message = (
                "worker shut down; grace period over"
                if handler_started
                else "worker shut down before the run's handler started"
            )
            await self._finish(Outcome.RELEASED, error={"code": "released", "message": message})

    async def _finish(
        self,
        outcome: Outcome,
        *,
        output: Any = None,
        error: dict[str, Any] | None = None,
        retry_delay_seconds: float | None = None,
        interrupt: Any = None,
        interrupt_expires_in: float | None = None,
    ) -> None:
        """Writes the outcome, retrying transient errors while the lease lasts."""
        error = redact(error)
        self.writing_outcome = True
        delay = 0.05
        while not self.context.lease_lost:
            try:
                finish = Finish(
                    self.run_id,
                    self.lease_token,
                    outcome,
                    output=output,
                    error=error,
                    retry_delay_seconds=retry_delay_seconds,
                    interrupt=interrupt,
                    interrupt_expires_in=interrupt_expires_in,
                    lane_id=self.claimed.lane_id,
                )
                if self._completions is not None:
                    # Lanes' runs too: the batch locks their lanes first.
                    self.final = await self._completions.finish(finish)
                else:
                    done = await self._store.finish_attempts_status([finish])
                    self.final = done.get(self.run_id)
            except TRANSIENT_ERRORS as exc:
                if self.lease.expired():
                    break
                logger.warning(
                    "run %s: writing %s failed (%s); retrying", self.run_id, outcome, exc
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            except psycopg.Error as exc:
                # The database refused the outcome itself (a value it cannot
                # store): end the run failed with a clean error rather than
                # abandon its lease and have the handler run again.
                logger.exception("run %s: the database refused outcome %s", self.run_id, outcome)
                if error is not None and error.get("code") == "outcome_write_failed":
                    return
                outcome, output, interrupt = Outcome.FAILED, None, None
                retry_delay_seconds = interrupt_expires_in = None
                error = {
                    "code": "outcome_write_failed",
                    "message": f"the outcome could not be stored: {type(exc).__name__}",
                }
                continue
            if self.final is None:
                logger.warning("run %s: lease lost before %s was recorded", self.run_id, outcome)
                self.context.mark_lease_lost()
                if self._metrics is not None:
                    self._metrics.leases_lost.inc()
            elif self._metrics is not None:
                self._metrics.count_finished(str(outcome))
            return
        logger.warning("run %s: lease ran out before %s was recorded", self.run_id, outcome)


def _exception_error(exc: BaseException) -> dict[str, Any]:
    return {
        "code": "exception",
        "type": type(exc).__qualname__,
        "message": str(exc).replace("\x00", ""),
        "traceback": "".join(traceback.format_exception(exc))[-4000:],
    }
