"""What a handler sees of its run: :class:`RunContext`."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

import psycopg
import psycopg_pool

from runlane.models import ClaimedRun
from runlane.outcomes import (
    MAX_DELAY_SECONDS,
    BudgetExceeded,
    Interrupted,
    LeaseLost,
    RunCancelled,
    ShutdownRequested,
    Steered,
)
from runlane.redaction import redact
from runlane.store import RunStore

if TYPE_CHECKING:
    from runlane.event_batches import EventBatcher

T = TypeVar("T")

# Errors after which a write may succeed if tried again (server restart,
# broken connection, pool exhausted while reconnecting).
TRANSIENT_ERRORS = (psycopg.OperationalError, psycopg_pool.PoolTimeout, TimeoutError)


class LeaseClock:
    """How long this worker may still act on a lease, by the local monotonic
    clock. Renewals move it forward; the watchdog stops the run's work once
    ``abandon_at`` passes, before the database could let the lease expire."""

    # Stop work when this share of the lease has gone by without a renewal.
    ABANDON_SHARE = 0.8

    def __init__(self, lease_seconds: float) -> None:
        self.lease_seconds = lease_seconds
        self.abandon_at = 0.0

    def renewed(self, sent_at: float) -> None:
        """A renewal (or the claim) sent at ``sent_at`` succeeded. The database
        computed its expiry after that instant, so this errs on the safe side."""
        self.abandon_at = max(self.abandon_at, sent_at + self.lease_seconds * self.ABANDON_SHARE)

    def expired(self) -> bool:
        return time.monotonic() >= self.abandon_at


class RunContext:
    """The handler's view of one attempt of one run.

    Every write goes through the store fenced by this attempt's lease token:
    when another attempt has taken over, the write changes nothing and
    :class:`LeaseLost` is raised here.
    """

    def __init__(
        self,
        claimed: ClaimedRun,
        store: RunStore,
        lease: LeaseClock,
        *,
        events: EventBatcher | None = None,
    ) -> None:
        self.run_id: UUID = claimed.id
        self.agent = claimed.agent
        self.tenant = claimed.tenant
        self.user_id = claimed.user_id
        self.thread_id = claimed.thread_id
        # The database the worker runs on (set by the worker): integrations
        # that keep state of their own (LangGraph's checkpointer) use it.
        self.database_url: str | None = None
        self.input: Any = claimed.input
        self.attempt: int = claimed.attempts
        self.max_attempts: int = claimed.max_attempts
        self.checkpoint: Any = claimed.checkpoint
        self.metadata: dict[str, Any] = claimed.metadata
        self.budget: dict[str, Any] = claimed.budget
        # Model turns taken so far, over every attempt of this run.
        self.turns: int = claimed.turns
        self.resume_value: Any = claimed.resume_value
        self.kind = claimed.kind
        self.lease_token: UUID = claimed.lease_token
        self._store = store
        # The worker's batcher of its runs' events; without one (a context
        # made outside a worker), each event is its own statement.
        self._events = events
        self._lease = lease
        self._deadline: float | None = (
            time.monotonic() + claimed.deadline_in_seconds
            if claimed.deadline_in_seconds is not None
            else None
        )
        self._cancel_requested = False
        # Made only for a handler that waits for a cancel (most never do).
        self._cancel_event: asyncio.Event | None = None
        self._shutdown_requested = False
        self._steer_requested = claimed.steer_requested_at is not None
        self._lease_lost = False

    # -- signals from the worker -------------------------------------------

    @property
    def cancel_requested(self) -> bool:
        return self._cancel_requested

    async def wait_cancel_requested(self) -> None:
        """Returns once a cancel request reaches this run."""
        if self._cancel_requested:
            return
        if self._cancel_event is None:
            self._cancel_event = asyncio.Event()
        await self._cancel_event.wait()

    def mark_cancel_requested(self) -> bool:
        """Returns True the first time."""
        if self._cancel_requested:
            return False
        self._cancel_requested = True
        if self._cancel_event is not None:
            self._cancel_event.set()
        return True

    def mark_steer_requested(self) -> None:
        self._steer_requested = True

    @property
    def steer_requested(self) -> bool:
        """A steer waits in this run's lane: yield at the next safe point."""
        return self._steer_requested

    def mark_shutdown_requested(self) -> None:
        self._shutdown_requested = True

    def mark_lease_lost(self) -> None:
        self._lease_lost = True

    @property
    def lease_lost(self) -> bool:
        return self._lease_lost

    @property
    def seconds_left(self) -> float | None:
        """Seconds until the budget deadline, None without one."""
        return None if self._deadline is None else self._deadline - time.monotonic()

    # -- the handler's API ---------------------------------------------------

    async def safe_point(self) -> None:
        """Raises if the run must stop here: its lease is lost, a cancel was
        requested, its deadline passed, a steer arrived in its lane, or the
        worker is shutting down. Call it before each model call and after a
        model turn that called no tools; never in the middle of a tool call."""
        self._check_lease()
        if self._cancel_requested:
            raise RunCancelled(f"run {self.run_id}: cancel requested")
        left = self.seconds_left
        if left is not None and left <= 0:
            raise BudgetExceeded("max_seconds")
        max_turns = self.budget.get("max_turns")
        if max_turns is not None and self.turns > max_turns:
            raise BudgetExceeded("max_turns")
        if self._steer_requested:
            raise Steered(f"run {self.run_id}: a steer arrived")
        if self._shutdown_requested:
            raise ShutdownRequested(f"run {self.run_id}: worker shutting down")

    async def turn(self) -> int:
        """Call before each model call: a safe point, then one more turn
        counted against ``budget.max_turns`` (over all attempts of the run).
        Raises BudgetExceeded once the budget is spent; returns the count."""
        await self.safe_point()
        count = await self._fenced(lambda: self._store.count_turn(self.run_id, self.lease_token))
        if count is None:
            self._lost()
        assert count is not None
        self.turns = count
        max_turns = self.budget.get("max_turns")
        if max_turns is not None and count > max_turns:
            raise BudgetExceeded("max_turns")
        return count

    async def interrupt(self, payload: Any, *, expires_in: float | None = None) -> None:
        """Ends the run ``interrupted`` with ``payload`` (the question for a
        human). A resume starts a new run of this agent with the answer in
        ``ctx.resume_value`` and this run's last checkpoint. With
        ``expires_in`` seconds, an unanswered interrupt ends ``cancelled``."""
        if expires_in is not None and not 0 < expires_in <= MAX_DELAY_SECONDS:
            raise ValueError(f"expires_in must be between 0 and {MAX_DELAY_SECONDS} seconds")
        raise Interrupted(payload, expires_in)

    async def emit(self, kind: str, data: Any = None) -> int:
        """Appends an event to the run's stream; returns its seq once the
        event is committed. Events that this worker's runs emit meanwhile
        are committed with it, in one statement (runlane.event_batches)."""
        # Events are shown to users: secrets never reach the stream.
        safe = redact({} if data is None else data)
        append = self._store.append_event if self._events is None else self._events.append
        seq = await self._fenced(lambda: append(self.run_id, self.lease_token, kind, safe))
        if seq is None:
            self._lost()
        assert seq is not None
        return seq

    async def save_checkpoint(self, checkpoint: Any) -> None:
        """Stores state that a later attempt of this run starts from."""
        saved = await self._fenced(
            lambda: self._store.save_checkpoint(self.run_id, self.lease_token, checkpoint)
        )
        if not saved:
            self._lost()
        self.checkpoint = checkpoint

    async def once(self, key: str, effect: Callable[[], Awaitable[T] | T]) -> T:
        """Runs ``effect`` unless this run already recorded a result under
        ``key``, and records its (JSON) result.

        At-least-once at the boundary: a process that dies after the effect
        but before the record commits runs it again on the next attempt.
        Pass ``f"{ctx.run_id}:{key}"`` to an external API as its idempotency
        key to close that gap.
        """
        found, recorded = await self._fenced(lambda: self._store.get_effect(self.run_id, key))
        if found:
            return recorded  # type: ignore[no-any-return]
        # Not a safe point (a tool call may be half way through its turn):
        # only a lost lease stops it here, as its result could not be kept.
        self._check_lease()
        value = effect()
        result = await value if inspect.isawaitable(value) else value
        owned, recorded = await self._fenced(
            lambda: self._store.record_effect(self.run_id, self.lease_token, key, result)
        )
        if not owned:
            self._lost()
        return recorded  # type: ignore[no-any-return]

    # -- internals -----------------------------------------------------------

    def _check_lease(self) -> None:
        """Raises LeaseLost when the lease is lost, or may have expired by
        the local monotonic clock: the watchdog stops such a run at its next
        tick, and nothing may start before it does (after the process was
        paused, this code can run before the watchdog's tick)."""
        if self._lease_lost or self._lease.expired():
            self._lost()

    def _lost(self) -> None:
        self._lease_lost = True
        raise LeaseLost(f"run {self.run_id}: lease lost")

    async def _fenced(self, write: Callable[[], Awaitable[T]]) -> T:
        """Runs a store call, retrying transient database errors while the
        lease can still be held; past that the run's work must stop anyway."""
        delay = 0.05
        while True:
            if self._lease_lost:
                raise LeaseLost(f"run {self.run_id}: lease lost")
            try:
                return await write()
            except TRANSIENT_ERRORS:
                if self._lease.expired():
                    self._lost()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
