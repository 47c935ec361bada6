"""One LISTEN connection that turns NOTIFY into wake-ups.

NOTIFY only wakes (DESIGN.md §3.9): every receiver also polls, so a lost
notification, or a listener that is down, only delays work.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import psycopg

from runlane.background import cancel_and_wait
from runlane.database import CONNECT_OPTIONS

logger = logging.getLogger(__name__)

Handler = Callable[[str, str], None]


class Listener:
    """Listens on ``channels`` and calls ``handler(channel, payload)``.

    Reconnects with backoff after the connection breaks, and then calls
    ``on_reconnect`` since notifications may have been missed meanwhile.
    """

    def __init__(
        self,
        url: str,
        channels: Sequence[str],
        handler: Handler,
        *,
        on_reconnect: Callable[[], None] | None = None,
    ) -> None:
        self._url = url
        self._channels = list(channels)
        self._handler = handler
        self._on_reconnect = on_reconnect
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="runlane-listener")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        delay = 0.1
        first = True
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True, **CONNECT_OPTIONS
                )
                async with conn:
                    for channel in self._channels:
                        await conn.execute(f'LISTEN "{channel}"')
                    self.connected.set()
                    if not first and self._on_reconnect is not None:
                        self._on_reconnect()
                    first = False
                    delay = 0.1
                    async for notify in conn.notifies():
                        self._handler(notify.channel, notify.payload)
            except Exception as exc:
                self.connected.clear()
                logger.warning("listener connection lost (%r); reconnecting in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
