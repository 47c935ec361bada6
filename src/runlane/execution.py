"""One attempt of one run inside a worker: call the handler, stop it when
told to, and write its outcome fenced by the lease token."""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import psycopg

from runlane.context import TRANSIENT_ERRORS, LeaseClock, RunContext
from runlane.models import ClaimedRun, Outcome, Run
from runlane.outcomes import (
    BudgetExceeded,
    Fail,
    Interrupted,
    LeaseLost,
    Retry,
    RunCancelled,
    ShutdownRequested,
    Steered,
)
from runlane.redaction import redact
from runlane.store import Finish, RunStore

if TYPE_CHECKING:
    from runlane.completions import CompletionBatcher
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
    ) -> None:
        self._metrics = metrics
        self._completions = completions
        self.claimed = claimed
        self.run_id = claimed.run.id
        self.lease = LeaseClock(lease_seconds)
        self.lease.renewed(claim_sent_at)
        self.context = RunContext(claimed, store, self.lease)
        self._handler = handler
        self._store = store
        self._handler_task: asyncio.Task[Any] | None = None
        self.stop_reason: StopReason | None = None
        self.final: Run | None = None
        self._timers: list[asyncio.TimerHandle] = []

    @property
    def lease_token(self) -> Any:
        return self.claimed.lease_token

    def stop(self, reason: StopReason) -> None:
        """Stops the handler's work now (it sees CancelledError)."""
        if self.stop_reason is None:
            self.stop_reason = reason
        if reason is StopReason.LEASE_LOST:
            self.context.mark_lease_lost()
        if self._handler_task is not None and not self._handler_task.done():
            self._handler_task.cancel(msg=f"runlane: {reason}")

    def stop_after(self, seconds: float, reason: StopReason) -> None:
        """Stops the handler after ``seconds`` unless it has ended by then."""
        loop = asyncio.get_running_loop()
        self._timers.append(loop.call_later(seconds, self.stop, reason))

    def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    async def run(self) -> None:
        """Runs the attempt to its end; never raises for the handler's sake."""
        run = self.claimed.run
        if self._handler is None:
            await self._finish(
                Outcome.FAILED,
                error={"code": "unknown_agent", "message": f"no agent named {run.agent!r}"},
            )
            return
        self._handler_task = asyncio.create_task(
            self._handler(self.context), name=f"runlane-run-{run.id}"
        )
        if self._metrics is not None:
            timer = self._metrics.handler_seconds.labels(agent=run.agent)
            started = time.monotonic()
            self._handler_task.add_done_callback(
                lambda _: timer.observe(time.monotonic() - started)
            )
        try:
            result = await asyncio.shield(self._handler_task)
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                # This task itself was cancelled (the event loop is going
                # away): stop the handler too; the lease expires and is reaped.
                self._handler_task.cancel()
                raise
            if self.stop_reason is not None:
                await self._after_stop()
                return
            # The handler's own code was cancelled (say, a sub-task it awaited):
            # an ordinary failure, retried with backoff.
            await self._finish(Outcome.RETRY, error=_exception_error(exc))
        except Retry as exc:
            await self._finish(
                Outcome.RETRY,
                error={"code": "retry_requested", "message": str(exc)},
                retry_delay_seconds=exc.delay,
            )
        except Fail as exc:
            await self._finish(Outcome.FAILED, error={"code": exc.code, "message": exc.message})
        except RunCancelled:
            await self._finish(Outcome.CANCELLED)
        except Steered:
            await self._finish(Outcome.STEERED)
        except Interrupted as exc:
            await self._finish(
                Outcome.INTERRUPTED, interrupt=exc.payload, interrupt_expires_in=exc.expires_in
            )
        except BudgetExceeded as exc:
            await self._finish(
                Outcome.FAILED,
                error={"code": "budget_exceeded", "message": f"budget exceeded: {exc.what}"},
            )
        except ShutdownRequested:
            await self._finish(
                Outcome.RELEASED,
                error={"code": "released", "message": "worker shut down at a safe point"},
            )
        except LeaseLost:
            logger.warning("run %s: lease lost; its work stopped", run.id)
        except Exception as exc:
            await self._finish(Outcome.RETRY, error=_exception_error(exc))
        else:
            problem = json_problem(result)
            if problem is not None:
                await self._finish(
                    Outcome.FAILED,
                    error={"code": "invalid_output", "message": f"output is not JSON: {problem}"},
                )
            else:
                await self._finish(Outcome.COMPLETED, output=result)

    async def _after_stop(self) -> None:
        if self.stop_reason is StopReason.LEASE_LOST:
            logger.warning("run %s: lease could not be renewed; its work stopped", self.run_id)
        elif self.stop_reason is StopReason.CANCELLED:
            await self._finish(Outcome.CANCELLED)
        elif self.stop_reason is StopReason.SHUTDOWN:
            await self._finish(
                Outcome.RELEASED,
                error={"code": "released", "message": "worker shut down; grace period over"},
            )

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
                )
                lane_id = self.claimed.run.lane_id
                if lane_id is None and self._completions is not None:
                    self.final = await self._completions.finish(finish)
                else:
                    # A lane's run ends under its lane's lock, on its own.
                    done = await self._store.finish_attempts([finish], lane_id=lane_id)
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
            elif self._metrics is not None:
                self._metrics.finished.labels(outcome=str(outcome)).inc()
            return
        logger.warning("run %s: lease ran out before %s was recorded", self.run_id, outcome)


def json_problem(value: Any) -> str | None:
    """Why PostgreSQL's jsonb would refuse ``value``, or None."""
    try:
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return str(exc)
    if "\\u0000" in encoded:
        return "NUL characters (\\u0000) cannot be stored"
    return None


def _exception_error(exc: BaseException) -> dict[str, Any]:
    return {
        "code": "exception",
        "type": type(exc).__qualname__,
        "message": str(exc).replace("\x00", ""),
        "traceback": "".join(traceback.format_exception(exc))[-4000:],
    }
