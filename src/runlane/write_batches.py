"""Writes that many tasks of a worker hand in, gathered into batches.

Items that arrive while a batch is being written go into the next one, so
a busy worker writes many per round trip and an idle one writes each at
once, without waiting for a timer. One batch is written at a time, on one
pooled connection. The outcome writes (:mod:`runlane.completions`) and the
event appends (:mod:`runlane.event_batches`) are such writes.
"""

from __future__ import annotations

import abc
import asyncio
from typing import Generic, TypeVar

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")


class WriteBatcher(abc.ABC, Generic[ItemT, ResultT]):
    def __init__(self, *, max_batch: int, task_name: str) -> None:
        self._max_batch = max_batch
        self._task_name = task_name
        self._pending: list[tuple[ItemT, asyncio.Future[ResultT]]] = []
        self._writer: asyncio.Task[None] | None = None
        self.batches = 0

    @property
    def pending(self) -> int:
        """Items waiting for their batch (the one being written excluded)."""
        return len(self._pending)

    async def _submit(self, item: ItemT) -> ResultT:
        """Writes ``item`` in some batch; what ``_write`` set for it."""
        future: asyncio.Future[ResultT] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_pending(), name=self._task_name)
        return await future

    async def _write_pending(self) -> None:
        await asyncio.sleep(0)  # let items of the same tick join the batch
        while self._pending:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            self.batches += 1
            await self._write(batch)

    @abc.abstractmethod
    async def _write(self, batch: list[tuple[ItemT, asyncio.Future[ResultT]]]) -> None:
        """Writes a batch and settles each item's future (a result or an
        exception); must not leave one unsettled."""


def fail_batch(batch: list[tuple[ItemT, asyncio.Future[ResultT]]], exc: BaseException) -> None:
    """Hands ``exc`` to every caller of the batch still waiting."""
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
