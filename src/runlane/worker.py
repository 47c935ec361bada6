"""The worker runtime: claim runs, run them, keep their leases, stop well.

``Worker`` claims in batches with SKIP LOCKED when it has free capacity,
wakes on NOTIFY and polls as a fallback, parks when idle (a standing
claim that a submit fills in its own transaction, see
``sql/migrations/0025_standing_claims.sql``), runs each attempt as an asyncio
task (see :mod:`runlane.execution`), renews all its leases in one statement
per tick (:mod:`runlane.heartbeat`) and runs the lease reaper. A
concurrency slot frees when a handler ends; its outcome is then written in
a batch (:mod:`runlane.completions`) while the next claim is on its way,
and the run keeps its lease, renewed, until the outcome is written. While
its handlers are short and runs are waiting, it claims up to its
concurrency of runs ahead, each started when a slot frees. ``stop()``
stops claiming, lets runs reach a safe point within a grace period, then
releases what remains.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Self
from uuid import UUID

from runlane.app import App
from runlane.collector import tune_collector
from runlane.completions import CompletionBatcher
from runlane.context import TRANSIENT_ERRORS
from runlane.database import create_pool
from runlane.event_batches import EventBatcher
from runlane.execution import Execution, StopReason
from runlane.heartbeat import Heartbeat
from runlane.lane_store import LaneStore
from runlane.listener import Listener
from runlane.models import ClaimedRun
from runlane.pruner import Pruner
from runlane.reaper import Reaper
from runlane.recovery import Recovery
from runlane.settings import Settings
from runlane.store import ClaimSpec, PushedRun, RunStore, WorkerIdentity
from runlane.worker_metrics import WorkerMetrics

logger = logging.getLogger(__name__)

WAKEUP_CHANNEL = "runlane_wakeup"
CANCEL_CHANNEL = "runlane_cancel"
STEER_CHANNEL = "runlane_steer"
PUSH_CHANNEL = "runlane_push"

# Pushed runs remembered, so that a run reported twice (by its NOTIFY and
# by the unpark that found it) starts once.
_PUSHES_REMEMBERED = 1024
# The most runs one claim takes by default, and the most a worker claims
# ahead of its handler slots (see Worker._ahead).
MAX_CLAIM = 200


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Worker:
    """Serves ``app``'s agents from the database at ``url``.

    It claims only runs of the agents it serves (``agents``, default: all
    the app registers), so workers of other apps, or of an older version
    during a rolling deploy, never take runs they cannot run. With
    ``claim_unknown_agents=True`` it claims runs of every agent and fails
    those it does not know with ``unknown_agent`` (one app per database).

    ``listen=False`` ignores NOTIFY (polling only); ``notify=False`` sends
    none. Both exist to show that polling alone makes progress.
    ``batch_size`` caps the runs one claim takes (default: 200, or the
    concurrency if that is more).
    """

    def __init__(
        self,
        app: App,
        url: str,
        *,
        concurrency: int = 10,
        batch_size: int | None = None,
        settings: Settings | None = None,
        worker_id: str | None = None,
        agents: Sequence[str] | None = None,
        claim_unknown_agents: bool = False,
        listen: bool = True,
        notify: bool = True,
        run_reaper: bool = True,
        metrics_port: int | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.app = app
        self.settings = settings or app.settings
        self.url = url
        self.concurrency = concurrency
        # The most runs one claim takes: the free slots and, while claiming
        # ahead (see _ahead), the runs beyond them, in one statement as long
        # as that is at most MAX_CLAIM runs. Each claim statement has a
        # fixed cost (about 0.5 ms of PostgreSQL's CPU, and as much for the
        # outcome batch that follows it) that weighs on claims of tens of
        # runs; past about 200 a bigger claim only delays its first run
        # (BENCHMARKS.md, section 1, twenty-sixth and twenty-seventh
        # sessions).
        self.batch_size = batch_size or max(concurrency, MAX_CLAIM)
        self.worker_id = worker_id or new_worker_id()
        self._served = list(agents) if agents is not None else None
        self.claim_unknown_agents = claim_unknown_agents
        self._listen = listen
        self.metrics = WorkerMetrics()
        self.metrics.track(lambda: self.handlers_running, lambda: len(self.executions))
        self._metrics_port = metrics_port
        self._pool = create_pool(
            url, min_size=2, max_size=concurrency + 3, check=False, in_utc=True
        )
        self.store = RunStore(self._pool, notify=notify)
        self.completions = CompletionBatcher(
            self.store, claim_along=self._claim_along, claimed_along=self._claimed_along
        )
        self.events = EventBatcher(self.store)
        # Every attempt held here, from its claim until its outcome is
        # written: the heartbeat renews all of them, also while an outcome
        # waits for its batch. A concurrency slot frees earlier, when the
        # handler ends, so that claiming overlaps the outcome writes; the
        # runs held stay bounded (see _free_slots): the handlers and the
        # runs claimed ahead, plus at most as many outcomes waiting to be
        # written as the larger of those two numbers.
        self.executions: dict[UUID, Execution] = {}
        self.handlers_running = 0
        # Runs claimed ahead (see _ahead), held and leased, in claim order:
        # each starts when a handler slot frees.
        self._prefetched: deque[Execution] = deque()
        # The handlers' recent mean time (a moving average over their
        # ends), None before the first ends: claiming ahead is only for
        # short handlers, where a run waits at most about that long.
        self._handler_mean: float | None = None
        # Slots promised to claims on their way (the claim loop's, and those
        # sent along with an outcome batch), so that the two never together
        # take more than the free slots.
        self._reserved = 0
        # Lanes' runs whose handler ended and whose outcome is not written
        # yet: their batch will claim along, so the claim loop waits for it
        # rather than race it to an empty claim (the lane's next run is
        # dispatched only when that outcome commits).
        self._lane_outcomes_pending = 0
        self._along_in_flight = 0
        self._along_idle = asyncio.Event()
        self._along_idle.set()
        self._tasks: dict[UUID, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._woken_by = "slot"
        # Whether runs may be waiting: the last claim was full, or a wake-up
        # NOTIFY came after it was sent. A handler's end claims at once only
        # then; otherwise the outcome's write wakes the claim loop, as do
        # NOTIFY and the poll (an empty claim there would only delay the
        # claim that a NOTIFY, say a lane's relay, asks for).
        self._backlog = True
        # Whether the claim loop's last claim came back full: then it does
        # not park (see _claim_loop), as runs are likely still waiting and
        # the plain claim is the cheaper statement.
        self._last_claim_full = False
        self._notifies = 0
        # Whether this worker's standing claim may be waiting in the
        # database: it holds one slot for the run a submit may push.
        self._parked = False
        # When the claim that left the standing claim was sent: a run pushed
        # to it was claimed (its lease began) after that, so it is the
        # instant its lease clock counts from, as a claim's send time is.
        self._parked_sent_at = 0.0
        self._pushes_seen: OrderedDict[UUID, None] = OrderedDict()
        self._push_tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._claim_task: asyncio.Task[None] | None = None
        self.heartbeat = Heartbeat(
            self.store,
            self.executions,
            lease_seconds=self.settings.lease_seconds,
            interval_seconds=self.settings.heartbeat_seconds,
            on_cancel_requested=self._cancel_requested,
            on_steer_requested=self._steer_requested,
            worker=self.identity,
            metrics=self.metrics,
        )
        self.listener: Listener | None = (
            Listener(
                url,
                [WAKEUP_CHANNEL, PUSH_CHANNEL, CANCEL_CHANNEL, STEER_CHANNEL],
                self._on_notify,
                on_reconnect=self._reconnected,
            )
            if listen
            else None
        )
        self.reaper: Reaper | None = (
            Reaper(self.store, interval_seconds=self.settings.reaper_interval_seconds)
            if run_reaper
            else None
        )
        self.pruner: Pruner | None = (
            Pruner(
                self.store,
                retention=self.settings.retention(),
                interval_seconds=self.settings.pruner_interval_seconds,
            )
            if run_reaper
            else None
        )
        self.recovery: Recovery | None = (
            Recovery(LaneStore(self._pool), interval_seconds=self.settings.reaper_interval_seconds)
            if run_reaper
            else None
        )
        # Counters a test or an operator can read.
        self.wakeups_by_notify = 0
        self.claims = 0
        self.claims_along = 0
        self.claims_pushed = 0
        self.claim_failures = 0

    @property
    def agents(self) -> list[str] | None:
        """The agents whose runs this worker claims; None means every agent."""
        if self.claim_unknown_agents:
            return None
        return self._served if self._served is not None else list(self.app.agents)

    def identity(self) -> WorkerIdentity:
        return WorkerIdentity(
            id=self.worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            agents=self.agents,
            concurrency=self.concurrency,
        )

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        tune_collector(self.settings.gc_threshold)
        await self._pool.open(wait=False)
        if self._metrics_port is not None:
            try:
                self.metrics.serve(self._metrics_port)
            except BaseException:
                # A taken port: nothing else has started; leave nothing open.
                await self._pool.close()
                raise
            await self.metrics.start_queue_gauges(self.store)
        await self.heartbeat.start()
        if self.listener is not None:
            await self.listener.start()
        if self.reaper is not None:
            await self.reaper.start()
        if self.recovery is not None:
            await self.recovery.start()
        if self.pruner is not None:
            await self.pruner.start()
        self._claim_task = asyncio.create_task(self._claim_loop(), name="runlane-claim")
        logger.info("worker %s started (concurrency %d)", self.worker_id, self.concurrency)

    async def stop(self, grace_seconds: float | None = None) -> None:
        """Stops claiming; runs reaching a safe point within the grace period
        are released (or finish); the rest are stopped and released."""
        grace = self.settings.shutdown_grace_seconds if grace_seconds is None else grace_seconds
        self._stopping = True
        self._wake.set()
        if self._claim_task is not None:
            try:
                await self._claim_task
            except BaseException:
                logger.exception("claim loop ended with an error")
        await self._withdraw_standing_claim()
        # A claim sent along with an outcome batch before the stop: its runs
        # start (and are then released like the others) before _release
        # looks at what is held.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._along_idle.wait(), self.settings.lease_seconds)
        try:
            await self._release(grace)
        finally:
            await self.metrics.stop()
            await self.heartbeat.stop()
            with contextlib.suppress(Exception):
                await self.store.worker_stopped(self.worker_id)
            if self.listener is not None:
                await self.listener.stop()
            if self.reaper is not None:
                await self.reaper.stop()
            if self.recovery is not None:
                await self.recovery.stop()
            if self.pruner is not None:
                await self.pruner.stop()
            await self._pool.close()
        logger.info("worker %s stopped", self.worker_id)

    async def _release(self, grace: float) -> None:
        for execution in self.executions.values():
            execution.context.mark_shutdown_requested()
        # Runs claimed ahead keep starting as slots free within the grace
        # period, each with the shutdown flag set like the others.
        deadline = time.monotonic() + grace
        while self._tasks and (left := deadline - time.monotonic()) > 0:
            await asyncio.wait(list(self._tasks.values()), timeout=left)
        for execution in list(self.executions.values()):
            execution.stop(StopReason.SHUTDOWN)
        # Those still waiting write their release without calling the handler.
        while self._prefetched:
            self._launch(self._prefetched.popleft())
        remaining = list(self._tasks.values())
        if remaining:
            await asyncio.wait(remaining, timeout=self.settings.lease_seconds)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def run_until_signalled(self) -> None:
        """Runs until SIGTERM or SIGINT, then stops gracefully."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        try:
            await stop.wait()
            logger.info("worker %s: signal received, shutting down", self.worker_id)
        finally:
            await self.stop()

    # -- claiming ------------------------------------------------------------

    async def _claim_loop(self) -> None:
        poll = self.settings.poll_seconds
        woken_by = "start"
        # A claim at least every poll interval, whatever wakes the loop in
        # between: it finds runs no NOTIFY announced (a delay that ran
        # out) and renews the standing claim.
        poll_at = time.monotonic()
        while not self._stopping:
            self._wake.clear()
            # A parked worker unparks in its claim: the claim then answers
            # the run a submit gave the standing claim, or takes one run
            # more with the slot the standing claim held.
            unpark = self._parked
            free = self._free_slots(self._ahead())
            # A slot that frees while the standing claim waits, with no
            # NOTIFY since the claim that left it, needs no claim: the
            # queue was drained then, and a run submitted since was pushed
            # to this worker or announced. Unless the poll is due: a slot
            # that frees as its timer runs out wakes the loop first.
            idle_slot = (
                woken_by == "slot" and unpark and not self._backlog and time.monotonic() < poll_at
            )
            if (free > 0 or unpark) and self._lane_outcomes_pending == 0 and not idle_slot:
                want = min(max(free, 0), self.batch_size)
                # Park whenever the claim may come back short, so that a
                # busy worker with a free slot also keeps a standing claim
                # and a submit pushes its run instead of waiting for a
                # claim; but not after a full claim, when runs are likely
                # still waiting and the plain claim is the cheaper one.
                park = self._may_park() and not self._last_claim_full
                spec = ClaimSpec(
                    worker_id=self.worker_id,
                    limit=want,
                    lease_seconds=self.settings.lease_seconds,
                    agents=self.agents,
                    aging_seconds=self.settings.priority_aging_seconds,
                    unpark=unpark,
                    # Parking again at each poll renews the standing claim;
                    # a worker that died stops taking runs a few polls later.
                    park_seconds=max(3 * self.settings.poll_seconds, 2.0) if park else None,
                )
                sent_at = time.monotonic()
                poll_at = sent_at + poll
                parked_sent_at = self._parked_sent_at
                notifies = self._notifies
                # Up to one run more than asked for: the standing claim's
                # (pushed, or claimed with its slot).
                held = want + (1 if unpark else 0)
                self._reserved += held
                self._parked = False
                try:
                    with self.metrics.claim_seconds.time():
                        batch = await self.store.claim(spec)
                except Exception as exc:
                    self.claim_failures += 1
                    # Whether the standing claim was withdrawn, or left
                    # anew, is unknown: the next claim withdraws it. A run
                    # pushed to a claim this one left began its lease after
                    # sent_at; to one left before, after the older instant.
                    self._parked = unpark or park
                    if park and not unpark:
                        self._parked_sent_at = sent_at
                    # The claim loop must outlive any error: a dead loop
                    # leaves a process that looks alive and claims nothing.
                    if isinstance(exc, TRANSIENT_ERRORS):
                        logger.warning("claim failed (%s); retrying", exc)
                    else:
                        logger.exception("claim failed; retrying")
                    self._backlog = True
                    woken_by = await self._sleep_or_wake(poll)
                    continue
                finally:
                    self._reserved -= held
                # Only an unparking claim can answer a pushed run.
                pushed = sum(1 for claimed in batch if claimed.pushed) if unpark else 0
                asked = want + (1 if unpark and not pushed else 0)
                claimed_now = len(batch) - pushed
                self._last_claim_full = asked > 0 and claimed_now == asked
                self._backlog = claimed_now == asked or self._notifies != notifies
                self.metrics.claims.inc(claimed_now)
                for claimed in batch:
                    if claimed.pushed:
                        self._take_pushed_run(claimed, parked_sent_at)
                    else:
                        self._start(claimed, sent_at)
                # claim_or_park parked again if the claim came back short.
                if park and claimed_now < asked:
                    self._parked = True
                    self._parked_sent_at = sent_at
                if claimed_now == asked and asked > 0:
                    woken_by = "full"
                    continue  # there may be more waiting
            now = time.monotonic()
            if poll_at <= now:
                # No claim went out this poll interval (no free slot): the
                # next is due one interval from now.
                poll_at = now + poll
            woken_by = await self._sleep_or_wake(poll_at - now)

    def _may_park(self) -> bool:
        """Whether a claim that comes back short leaves a standing claim:
        only a listening worker hears of the runs pushed to it at once."""
        return not self._stopping and self.listener is not None and self.agents != []

    async def _withdraw_standing_claim(self) -> None:
        """At stop: no submit may push to this worker any more; a run pushed
        before starts, and is released with the others."""
        if self.listener is None:
            return
        try:
            pushed = await self.store.unpark(self.worker_id)
        except Exception as exc:
            # The row expires on its own; a run pushed meanwhile is
            # recovered by the reaper when its lease expires.
            logger.warning("could not withdraw the standing claim (%s)", exc)
            pushed = None
        self._parked = False
        if pushed is not None:
            self._take_pushed(pushed)
        if self._push_tasks:
            await asyncio.wait(list(self._push_tasks), timeout=self.settings.lease_seconds)

    def _first_push(self, run_id: UUID) -> bool:
        """Whether this is the first report of a run pushed to this worker
        (its NOTIFY and the unpark that found it may both report it)."""
        if run_id in self._pushes_seen:
            return False
        self._pushes_seen[run_id] = None
        if len(self._pushes_seen) > _PUSHES_REMEMBERED:
            self._pushes_seen.popitem(last=False)
        # The standing claim is spent: its slot passes to the run.
        self._parked = False
        return True

    def _take_pushed_run(self, claimed: ClaimedRun, parked_sent_at: float) -> None:
        """A pushed run, as its NOTIFY or the unpark carried it: start it,
        its lease counted from when the standing claim was left."""
        if self._first_push(claimed.id):
            self.claims_pushed += 1
            self.metrics.claims.inc()
            self._start(claimed, parked_sent_at)

    def _take_pushed(self, pushed: PushedRun) -> None:
        """A pushed run named only (too large for its NOTIFY, or found at
        stop): read it, then start it."""
        if not self._first_push(pushed.run_id):
            return
        self._reserved += 1
        task = asyncio.create_task(
            self._start_pushed(pushed, self._parked_sent_at), name="runlane-pushed"
        )
        self._push_tasks.add(task)
        task.add_done_callback(self._push_tasks.discard)

    async def _start_pushed(self, pushed: PushedRun, parked_sent_at: float) -> None:
        claimed = None
        try:
            for attempt in range(3):
                try:
                    claimed = await self.store.get_pushed_run(pushed)
                    break
                except TRANSIENT_ERRORS as exc:
                    logger.warning("reading pushed run %s failed (%s)", pushed.run_id, exc)
                    await asyncio.sleep(0.1 * (attempt + 1))
        except Exception:
            # Its lease expires and the reaper gives it to another attempt.
            logger.exception("reading pushed run %s failed", pushed.run_id)
        finally:
            self._reserved -= 1
        if claimed is not None:
            self.claims_pushed += 1
            self.metrics.claims.inc()
            self._start(claimed, parked_sent_at)
        else:
            self._wake.set()  # the slot is free again

    def _free_slots(self, ahead: int = 0) -> int:
        """Runs this worker may claim now: handler slots (and ``ahead``
        runs more, to wait for one) and held runs left, less those promised
        to claims on their way and the one a standing claim holds. Held
        runs include outcomes waiting for their batch: at most the larger
        of the concurrency and ``ahead`` of them, so that outcome writes
        that fall behind stop the claims instead of piling up leases."""
        in_hand = self.concurrency + ahead
        return (
            min(
                in_hand - self.handlers_running - len(self._prefetched),
                in_hand + max(self.concurrency, ahead) - len(self.executions),
            )
            - self._reserved
            - (1 if self._parked else 0)
        )

    def _ahead(self) -> int:
        """How many runs the claim loop may claim beyond the free handler
        slots: while runs are waiting and the handlers are short (their
        mean below ``prefetch_handler_seconds``), as many as the handler
        slots get through in about that time, at least the concurrency and
        at most MAX_CLAIM. The next claim is then on its way while a batch
        runs rather than after it (one process waits for its claim, and
        PostgreSQL for the process, otherwise), and with very short
        handlers each claim and outcome batch carries up to MAX_CLAIM runs
        whatever the concurrency, which spreads the statements' fixed cost.
        A run claimed ahead is leased and waits for a slot, about
        ``prefetch_handler_seconds`` at most (one handler's time where the
        concurrency bounds it); with longer handlers another worker may be
        free for it, so none are claimed ahead."""
        mean = self._handler_mean
        horizon = self.settings.prefetch_handler_seconds
        if mean is None or mean >= horizon or not self._backlog:
            return 0
        through = self.concurrency * horizon / mean if mean > 0 else MAX_CLAIM
        return max(self.concurrency, min(MAX_CLAIM, int(through)))

    @property
    def prefetched(self) -> int:
        """Runs claimed ahead, waiting for a handler slot."""
        return len(self._prefetched)

    def _claim_along(self) -> ClaimSpec | None:
        """The claim to send with an outcome batch that ends lanes' runs
        (see CompletionBatcher): as many runs as there are free slots."""
        free = self._free_slots()
        if self._stopping or free <= 0:
            return None
        want = min(free, self.batch_size)
        self._reserved += want
        self._along_in_flight += 1
        self._along_idle.clear()
        return ClaimSpec(
            worker_id=self.worker_id,
            limit=want,
            lease_seconds=self.settings.lease_seconds,
            agents=self.agents,
            aging_seconds=self.settings.priority_aging_seconds,
        )

    def _claimed_along(self, claim: ClaimSpec, batch: list[ClaimedRun], sent_at: float) -> None:
        self._reserved -= claim.limit
        self._along_in_flight -= 1
        if self._along_in_flight == 0:
            self._along_idle.set()
        self.claims_along += len(batch)
        self.metrics.claims.inc(len(batch))
        for claimed in batch:
            self._start(claimed, sent_at)
        if len(batch) == claim.limit:
            self._backlog = True
            self._last_claim_full = True

    async def _sleep_or_wake(self, seconds: float) -> str:
        """Waits for a wake-up, or ``seconds`` at most; answers what woke
        the claim loop (see _woken_by)."""
        # A timer rather than wait_for(), which would wrap each wait in a
        # task of its own: a wake-up reaches the claim in one loop step.
        poll = asyncio.get_running_loop().call_later(seconds, self._poll_due)
        try:
            await self._wake.wait()
        finally:
            poll.cancel()
        woken_by, self._woken_by = self._woken_by, "slot"
        # A push is counted as it arrives (_on_push), once per run.
        if woken_by != "push":
            self.metrics.wakeups.labels(source=woken_by).inc()
        return woken_by

    def _poll_due(self) -> None:
        if not self._wake.is_set():
            self._woken_by = "poll"
            self._wake.set()

    def _start(self, claimed: ClaimedRun, sent_at: float) -> None:
        self.claims += 1
        execution = Execution(
            claimed,
            self.app.agents.get(claimed.agent),
            self.store,
            lease_seconds=self.settings.lease_seconds,
            claim_sent_at=sent_at,
            metrics=self.metrics,
            completions=self.completions,
            events=self.events,
            on_handler_end=(
                self._handler_ended if claimed.lane_id is None else self._lane_handler_ended
            ),
        )
        execution.context.database_url = self.url
        self.executions[claimed.id] = execution
        if self.handlers_running < self.concurrency and not self._prefetched:
            self._launch(execution)
        else:
            self._prefetched.append(execution)

    def _launch(self, execution: Execution) -> None:
        self.handlers_running += 1
        # Named without the run's id (formatting a UUID per run is measurable
        # CPU); self.executions maps each run to its task.
        task = asyncio.create_task(self._run(execution), name="runlane-attempt")
        execution.task = task
        self._tasks[execution.run_id] = task

    def _slot_freed(self, seconds: float) -> None:
        """A handler ended after ``seconds``: the next run claimed ahead
        takes its slot."""
        mean = self._handler_mean
        self._handler_mean = seconds if mean is None else mean + 0.2 * (seconds - mean)
        self.handlers_running -= 1
        if self._prefetched and self.handlers_running < self.concurrency:
            self._launch(self._prefetched.popleft())

    def _handler_ended(self, seconds: float) -> None:
        """An attempt's handler is over (its outcome may still be on its
        way to the database): its concurrency slot is free."""
        self._slot_freed(seconds)
        if self._backlog:
            self._wake.set()

    def _lane_handler_ended(self, seconds: float) -> None:
        """A lane's run: its outcome's batch claims along (the lane's next
        run is dispatched in that transaction), so the claim loop is not
        woken ahead of it, to an empty claim that would take the slot."""
        self._slot_freed(seconds)
        self._lane_outcomes_pending += 1

    async def _run(self, execution: Execution) -> None:
        try:
            await execution.run()
        except Exception:
            logger.exception("run %s: unexpected error in the worker", execution.run_id)
        finally:
            # Frees the slot too if run() ended without the handler's end.
            execution.close()
            if execution.claimed.lane_id is not None:
                self._lane_outcomes_pending -= 1
            # The same run may already be claimed again by this worker (a
            # retry with no delay): only forget this attempt's own entry.
            if self.executions.get(execution.run_id) is execution:
                del self.executions[execution.run_id]
                self._tasks.pop(execution.run_id, None)
            self._wake.set()

    # -- notices -------------------------------------------------------------

    def _on_notify(self, channel: str, payload: str) -> None:
        if channel == WAKEUP_CHANNEL:
            agents = self.agents
            if agents is None or not payload or payload in agents:
                self.wakeups_by_notify += 1
                self._notifies += 1
                self._backlog = True
                self._woken_by = "notify"
                self._wake.set()
        elif channel == PUSH_CHANNEL:
            self._on_push(payload)
        elif channel in (CANCEL_CHANNEL, STEER_CHANNEL):
            with contextlib.suppress(ValueError):
                execution = self.executions.get(UUID(payload))
                if execution is None:
                    return
                if channel == CANCEL_CHANNEL:
                    self._cancel_requested(execution)
                else:
                    self._steer_requested(execution)

    def _on_push(self, payload: str) -> None:
        """A submit gave a standing claim a run (see insert_run): if this
        worker's, start it; the payload carries the run unless too large."""
        try:
            message = json.loads(payload)
            if message["worker_id"] != self.worker_id:
                return
            self.metrics.wakeups.labels(source="push").inc()
            # A push carries the claim's columns; before migration 0046 it
            # carried the run's row; one too large for either names the run.
            if "claim" in message:
                claimed = ClaimedRun.from_pushed_claim(
                    message["claim"], message["deadline_in_seconds"]
                )
            elif "run" in message:
                claimed = ClaimedRun.from_pushed_json(
                    message["run"], message["deadline_in_seconds"]
                )
            else:
                self._take_pushed(PushedRun(UUID(message["run_id"]), UUID(message["lease_token"])))
                self._repark()
                return
            self._take_pushed_run(claimed, self._parked_sent_at)
            self._repark()
        except (ValueError, KeyError, TypeError):
            # Not a push this version understands: the unpark in the next
            # claim (at the latest the next poll) finds the run.
            logger.warning("unreadable push notification: %.200s", payload)
            self._backlog = True
            self._wake.set()

    def _repark(self) -> None:
        """A submit spent the standing claim: the claim loop leaves a new
        one now, while the pushed run is under way, rather than after its
        outcome is written, so that the next submit can push too."""
        if not self._parked and not self._wake.is_set():
            self._woken_by = "push"
            self._wake.set()

    def _reconnected(self) -> None:
        """NOTIFYs may have been missed while the listener was away."""
        self._backlog = True
        self._wake.set()

    def _steer_requested(self, execution: Execution) -> None:
        """The handler yields at its next safe point; a steer never stops a
        tool call in progress."""
        execution.context.mark_steer_requested()

    def _cancel_requested(self, execution: Execution) -> None:
        """Tells the handler; stops it if it has not stopped after the grace."""
        if not execution.context.mark_cancel_requested():
            return
        logger.info("run %s: cancel requested", execution.run_id)
        if execution in self._prefetched:
            # Its handler has not started: there is nothing to wait for.
            self._prefetched.remove(execution)
            execution.stop(StopReason.CANCELLED)
            self._launch(execution)
            return
        execution.stop_after(self.settings.cancel_grace_seconds, StopReason.CANCELLED)
