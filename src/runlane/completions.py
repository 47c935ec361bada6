"""Batches a worker's attempt outcomes into one statement.

Outcomes that arrive while a batch is being written go into the next one,
so a busy worker writes many completions per round trip and an idle one
writes each at once. Each outcome stays fenced by its own lease token.
Lanes' runs join the same batches: the batch's transaction locks their
lanes first, in id order (``RunStore.finish_attempts_status``).
"""

from __future__ import annotations

import asyncio
import logging

import psycopg

from runlane.context import TRANSIENT_ERRORS
from runlane.models import RunStatus
from runlane.store import Finish, RunStore

logger = logging.getLogger(__name__)

Pending = tuple[Finish, asyncio.Future[RunStatus | None]]


class CompletionBatcher:
    def __init__(self, store: RunStore, *, max_batch: int = 200) -> None:
        self._store = store
        self._max_batch = max_batch
        self._pending: list[Pending] = []
        self._writer: asyncio.Task[None] | None = None
        self.batches = 0

    @property
    def pending(self) -> int:
        """Outcomes waiting for their batch (the one being written excluded)."""
        return len(self._pending)

    async def finish(self, finish: Finish) -> RunStatus | None:
        """Writes the outcome (in some batch); the run's new status, or None
        when the token no longer held the lease."""
        future: asyncio.Future[RunStatus | None] = asyncio.get_running_loop().create_future()
        self._pending.append((finish, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_pending(), name="runlane-completions")
        return await future

    async def _write_pending(self) -> None:
        await asyncio.sleep(0)  # let outcomes of the same tick join the batch
        while self._pending:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            await self._write(batch)

    async def _write(self, batch: list[Pending]) -> None:
        self.batches += 1
        try:
            finished = await self._store.finish_attempts_status([finish for finish, _ in batch])
        except TRANSIENT_ERRORS as exc:
            # Each caller retries on its own while its lease lasts.
            _fail(batch, exc)
        except psycopg.Error as exc:
            if len(batch) == 1:
                _fail(batch, exc)
                return
            # One value the database refuses must not fail its neighbours.
            logger.warning("a batch of %d outcomes was refused; writing one by one", len(batch))
            for item in batch:
                await self._write([item])
        except BaseException as exc:
            _fail(batch, exc)
            raise
        else:
            for finish, future in batch:
                if not future.done():
                    future.set_result(finished.get(finish.run_id))


def _fail(batch: list[Pending], exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
