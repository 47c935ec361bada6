"""Batches a worker's attempt outcomes into one statement.

Outcomes that arrive while a batch is being written go into the next one,
so a busy worker writes many completions per round trip and an idle one
writes each at once. Each outcome stays fenced by its own lease token.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg

from runlane.context import TRANSIENT_ERRORS
from runlane.models import Run
from runlane.store import Finish, RunStore

logger = logging.getLogger(__name__)


class CompletionBatcher:
    def __init__(self, store: RunStore, *, max_batch: int = 200) -> None:
        self._store = store
        self._max_batch = max_batch
        self._pending: list[tuple[Finish, asyncio.Future[Run | None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.batches = 0

    async def finish(self, finish: Finish) -> Run | None:
        """Writes the outcome (in some batch); the run as it now is, or None
        when the token no longer held the lease."""
        future: asyncio.Future[Run | None] = asyncio.get_running_loop().create_future()
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

    async def _write(self, batch: list[tuple[Finish, asyncio.Future[Run | None]]]) -> None:
        self.batches += 1
        try:
            finished = await self._store.finish_attempts([finish for finish, _ in batch])
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


def _fail(batch: list[tuple[Finish, asyncio.Future[Run | None]]], exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
