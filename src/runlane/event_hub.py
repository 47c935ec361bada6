"""One LISTEN connection per process that fans notifications out to every
subscriber of the API's event streams.

Subscribers never hold a database connection while they wait: they wait on
an asyncio event, then read the tables (the source of truth). A missed
NOTIFY only delays delivery until the subscriber's next periodic re-read.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from runlane.listener import Listener

RUN_CHANGES = "runlane_run_changes"
LANE_CHANGES = "runlane_lane_changes"


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


class EventHub:
    def __init__(self, url: str) -> None:
        self._topics: dict[str, set[Subscription]] = defaultdict(set)
        self.listener = Listener(
            url, [RUN_CHANGES, LANE_CHANGES], self._on_notify, on_reconnect=self._wake_all
        )
        self.notifications = 0

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

    def _remove(self, subscription: Subscription) -> None:
        subs = self._topics.get(subscription.topic)
        if subs is not None:
            subs.discard(subscription)
            if not subs:
                del self._topics[subscription.topic]

    def _on_notify(self, channel: str, payload: str) -> None:
        self.notifications += 1
        prefix = "run" if channel == RUN_CHANGES else "lane"
        for subscription in self._topics.get(f"{prefix}:{payload}", ()):
            subscription.notify()

    def _wake_all(self) -> None:
        # Notifications may have been missed while reconnecting.
        for subs in self._topics.values():
            for subscription in subs:
                subscription.notify()
