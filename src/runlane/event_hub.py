"""One LISTEN connection per process that fans notifications out to every
subscriber of the API's event streams.

Subscribers never hold a database connection while they wait: they wait on
an asyncio event, then read the tables (the source of truth). A missed
NOTIFY only delays delivery until the next periodic re-read.

A run's stream is read once per topic, not once per subscriber: the topic
(``RunTopic``) keeps the last seq it read and the events read since, and
one read per notification (a run's state and its new events, from one
snapshot) serves every subscriber of that run. A subscriber further behind
than the topic's window (a ``Last-Event-ID`` replay) reads its own pages
until it catches up.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool

from runlane.listener import Listener
from runlane.models import Event, RunStatus
from runlane.queries import named_queries

RUN_CHANGES = "runlane_run_changes"
LANE_CHANGES = "runlane_lane_changes"

# A missed NOTIFY delays delivery by about this long.
REREAD_SECONDS = 2.0
# Events read per query.
PAGE = 500
# Events a run topic keeps for its subscribers; one further behind reads
# its own pages.
WINDOW = 2 * PAGE


class Subscription:
    """Wake-ups for one topic ("run:<id>" or "lane:<id>")."""

    def __init__(self, hub: EventHub, topic: str) -> None:
        self._hub = hub
        self.topic = topic
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()

    async def wait(self, timeout: float) -> bool:
        """Waits for a change (True) or the timeout (False); re-arms."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self._event.clear()

    def close(self) -> None:
        self._hub._remove(self)


@dataclass(frozen=True, slots=True)
class RunEnd:
    """A run's final state, as the ``end`` event reports it."""

    run_id: UUID
    status: RunStatus
    outcome: str | None
    output: Any
    error: Any
    interrupt: Any


@dataclass(frozen=True, slots=True)
class Batch:
    """What a subscriber gets from one read."""

    events: list[Event]
    # The run ended and ``events`` reach its last event.
    end: RunEnd | None = None
    # More events are already there: read again without waiting.
    more: bool = False
    # The run no longer exists (pruned): the stream ends.
    gone: bool = False


@dataclass(frozen=True, slots=True)
class _Page:
    events: list[Event]
    end: RunEnd | None
    full: bool
    gone: bool


class RunTopic:
    """The shared read position of one run's stream."""

    def __init__(self, hub: EventHub, run_id: UUID) -> None:
        self._hub = hub
        self.run_id = run_id
        # Events read by the shared reads: every event with floor < seq <= seq.
        self.floor: int | None = None
        self.seq = 0
        self.events: list[Event] = []
        self.end: RunEnd | None = None
        self.gone = False
        # A change was announced (or more events wait) since the last read began.
        self.dirty = True
        self._read_started = float("-inf")
        self._reading: asyncio.Task[None] | None = None
        self.reads = 0

    def changed(self) -> None:
        self.dirty = True

    async def read(self, after: int, *, periodic: bool = False) -> Batch:
        """The events after ``after`` for one subscriber; with ``periodic``,
        the topic re-reads the tables if nobody did for half the re-read
        interval (a lost NOTIFY only delays)."""
        lost = periodic and time.monotonic() - self._read_started >= self._hub.reread_seconds / 2
        if lost:
            self.dirty = True
        if self.floor is None:
            # Nothing read yet: the shared window starts at the first reader.
            self.floor = self.seq = after
        if self.dirty and self._reading is not None:
            # That read began before this change: wait it out, then read anew.
            await asyncio.shield(self._reading)
        if self.dirty and self._reading is None and self.end is None and not self.gone:
            self.dirty = False
            self._read_started = time.monotonic()
            self._reading = self._hub.keep(self._shared_read(wake_others=lost))
        if self._reading is not None:
            await asyncio.shield(self._reading)
        if after < self.floor:
            # Behind the window: this subscriber's own page.
            page = await self._hub.read_page(self.run_id, after)
            return Batch(page.events, end=page.end, more=bool(page.events), gone=page.gone)
        events = [event for event in self.events if event.seq > after]
        return Batch(events, end=self.end, more=self.dirty and self.end is None, gone=self.gone)

    async def _shared_read(self, *, wake_others: bool) -> None:
        try:
            self.reads += 1
            self._hub.reads += 1
            page = await self._hub.read_page(self.run_id, self.seq)
            if page.events:
                self.events.extend(page.events)
                self.seq = page.events[-1].seq
                if len(self.events) > WINDOW:
                    dropped = len(self.events) - WINDOW
                    self.floor = self.events[dropped - 1].seq
                    del self.events[:dropped]
            if page.full:
                self.dirty = True
            self.end = page.end
            self.gone = page.gone
            if wake_others and (page.events or page.end or page.gone):
                # A re-read found what a lost NOTIFY did not announce: every
                # subscriber of the run hears of it now, not at its own re-read.
                self._hub.wake(f"run:{self.run_id}")
        except BaseException:
            self.dirty = True  # the next reader tries again
            raise
        finally:
            self._reading = None


def _retrieve(future: asyncio.Future[None]) -> None:
    # Every waiter may have gone; the outcome is still consumed.
    if not future.cancelled():
        future.exception()


class RunSubscription(Subscription):
    """Wake-ups for one run, and its topic's shared reads."""

    def __init__(self, hub: EventHub, topic: str, feed: RunTopic) -> None:
        super().__init__(hub, topic)
        self.feed = feed


class EventHub:
    def __init__(
        self,
        url: str,
        pool: AsyncConnectionPool[AsyncConnection[DictRow]],
        *,
        reread_seconds: float = REREAD_SECONDS,
    ) -> None:
        self._topics: dict[str, set[Subscription]] = defaultdict(set)
        self._runs: dict[str, RunTopic] = {}
        self._reads_in_flight: set[asyncio.Task[None]] = set()
        self.pool = pool
        self.reread_seconds = reread_seconds
        self._sql = named_queries("streams.sql")
        self.listener = Listener(
            url, [RUN_CHANGES, LANE_CHANGES], self._on_notify, on_reconnect=self._wake_all
        )
        self.notifications = 0
        # Shared reads of run topics (one per notification per topic at most).
        self.reads = 0

    async def start(self) -> None:
        await self.listener.start()

    async def stop(self) -> None:
        await self.listener.stop()

    @property
    def subscriber_count(self) -> int:
        return sum(len(subs) for subs in self._topics.values())

    def subscribe(self, topic: str) -> Subscription:
        subscription = Subscription(self, topic)
        self._topics[topic].add(subscription)
        return subscription

    def subscribe_run(self, run_id: UUID) -> RunSubscription:
        topic = f"run:{run_id}"
        feed = self._runs.get(topic)
        if feed is None:
            feed = self._runs[topic] = RunTopic(self, run_id)
        subscription = RunSubscription(self, topic, feed)
        self._topics[topic].add(subscription)
        return subscription

    def keep(self, read: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Runs a shared read as a task that outlives any one subscriber."""
        task = asyncio.create_task(read)
        self._reads_in_flight.add(task)
        task.add_done_callback(self._reads_in_flight.discard)
        task.add_done_callback(_retrieve)
        return task

    def run_topic(self, run_id: UUID) -> RunTopic | None:
        """The run's topic while it has subscribers."""
        return self._runs.get(f"run:{run_id}")

    def _remove(self, subscription: Subscription) -> None:
        subs = self._topics.get(subscription.topic)
        if subs is not None:
            subs.discard(subscription)
            if not subs:
                del self._topics[subscription.topic]
                self._runs.pop(subscription.topic, None)

    async def read_page(self, run_id: UUID, after: int) -> _Page:
        """The run's state and its events after ``after`` (one page), from
        one snapshot: once the run is seen ended, its events are all here."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                self._sql["run_stream_page"], {"run_id": run_id, "after_seq": after, "limit": PAGE}
            )
            rows = await cur.fetchall()
        if not rows:
            return _Page([], None, full=False, gone=True)
        events = [
            Event(run_id, row["seq"], row["kind"], row["data"], row["attempt"], row["created_at"])
            for row in rows
            if row["seq"] is not None
        ]
        full = len(events) >= PAGE
        first = rows[0]
        status = RunStatus(first["status"])
        end = None
        if status.is_terminal and not full:
            end = RunEnd(
                run_id,
                status,
                first["outcome"],
                first["output"],
                first["error"],
                first["interrupt"],
            )
        return _Page(events, end, full=full, gone=False)

    def _on_notify(self, channel: str, payload: str) -> None:
        self.notifications += 1
        if channel != RUN_CHANGES:
            self.wake(f"lane:{payload}")
            return
        # A worker's outcome write names every run of its batch that ended in
        # one notification, comma-separated (migration 0047); other writers
        # name one run.
        for run_id in payload.split(","):
            topic = f"run:{run_id}"
            feed = self._runs.get(topic)
            if feed is not None:
                feed.changed()
            self.wake(topic)

    def wake(self, topic: str) -> None:
        for subscription in self._topics.get(topic, ()):
            subscription.notify()

    def _wake_all(self) -> None:
        # Notifications may have been missed while reconnecting.
        for feed in self._runs.values():
            feed.changed()
        for subs in self._topics.values():
            for subscription in subs:
                subscription.notify()
