"""Batches the events a worker's runs emit into one statement.

A streaming handler emits an event per token, and each emit used to be a
transaction of its own on a connection of its own. Events that runs emit
while a batch is being written now go into the next one
(:mod:`runlane.write_batches`), appended by ``runlane.append_events``
(migration 0036): one round trip and one commit for all of them, each run's
row updated once. ``emit`` keeps its contract: it returns once its event is
committed, with its seq, and each event stays fenced by its own attempt's
lease token.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from uuid import UUID

from runlane.context import TRANSIENT_ERRORS
from runlane.store import EventAppend, RunStore
from runlane.write_batches import WriteBatcher, fail_batch

logger = logging.getLogger(__name__)


class EventBatcher(WriteBatcher[EventAppend, int | None]):
    def __init__(self, store: RunStore, *, max_batch: int = 500) -> None:
        super().__init__(max_batch=max_batch, task_name="runlane-events")
        self._store = store

    async def append(self, run_id: UUID, lease_token: UUID, kind: str, data: Any) -> int | None:
        """Appends an event (in some batch); its seq, or None when the token
        no longer held the lease."""
        return await self._submit(EventAppend(run_id, lease_token, kind, data))

    async def _write(self, batch: list[tuple[EventAppend, asyncio.Future[int | None]]]) -> None:
        try:
            seqs = await self._store.append_events([event for event, _ in batch])
        except TRANSIENT_ERRORS as exc:
            # A broken connection or a restart: each caller retries on its own
            # while its lease lasts (RunContext._fenced).
            fail_batch(batch, exc)
        except Exception as exc:
            if len(batch) == 1:
                fail_batch(batch, exc)
                return
            # One event the database refuses (a NUL character in a string,
            # say) or that does not dump to JSON must fail its own emit only:
            # one by one, alone.
            logger.warning("a batch of %d events was refused; appending one by one", len(batch))
            for item in batch:
                await self._write([item])
        except BaseException as exc:
            fail_batch(batch, exc)
            raise
        else:
            for (_, future), seq in zip(batch, seqs, strict=True):
                if not future.done():
                    future.set_result(seq)
