"""Batches a worker's attempt outcomes into one statement.

Outcomes that arrive while a batch is being written go into the next one,
so a busy worker writes many completions per round trip and an idle one
writes each at once. Each outcome stays fenced by its own lease token.
Lanes' runs join the same batches: the batch's transaction locks their
lanes first, in id order (``RunStore.finish_attempts_status``). A batch
that ends lanes' runs also claims, in the same transaction, what the
worker has room for (``claim_along``): the lanes' next runs, dispatched by
the relay in that transaction, start without waiting for a NOTIFY and a
claim of their own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import psycopg

from runlane.context import TRANSIENT_ERRORS
from runlane.models import ClaimedRun, RunStatus
from runlane.store import ClaimSpec, Finish, RunStore
from runlane.write_batches import WriteBatcher, fail_batch

logger = logging.getLogger(__name__)

Pending = tuple[Finish, asyncio.Future[RunStatus | None]]

# Asked before a batch with lanes' runs is written: what to claim along
# (None: nothing; the worker reserves the slots it hands out).
ClaimAlong = Callable[[], ClaimSpec | None]
# Told after that batch, also when it failed (with no runs): the runs
# claimed along and when the claim was sent (time.monotonic()).
ClaimedAlong = Callable[[ClaimSpec, list[ClaimedRun], float], None]


class CompletionBatcher(WriteBatcher[Finish, RunStatus | None]):
    def __init__(
        self,
        store: RunStore,
        *,
        max_batch: int = 200,
        claim_along: ClaimAlong | None = None,
        claimed_along: ClaimedAlong | None = None,
    ) -> None:
        super().__init__(max_batch=max_batch, task_name="runlane-completions")
        self._store = store
        self._claim_along = claim_along
        self._claimed_along = claimed_along

    async def finish(self, finish: Finish) -> RunStatus | None:
        """Writes the outcome (in some batch); the run's new status, or None
        when the token no longer held the lease."""
        return await self._submit(finish)

    async def _write(self, batch: list[Pending], *, claiming: bool = True) -> None:
        claim = None
        lanes = any(finish.lane_id is not None for finish, _ in batch)
        if claiming and lanes and self._claim_along is not None:
            claim = self._claim_along()
        sent_at = time.monotonic()
        claimed: list[ClaimedRun] = []
        try:
            finished, claimed = await self._store.finish_attempts_and_claim(
                [finish for finish, _ in batch], claim
            )
        except TRANSIENT_ERRORS as exc:
            # Each caller retries on its own while its lease lasts.
            fail_batch(batch, exc)
        except psycopg.Error as exc:
            if len(batch) == 1 and claim is None:
                fail_batch(batch, exc)
                return
            # One value the database refuses must not fail its neighbours
            # (and a claim must not fail the outcomes): one by one, alone.
            logger.warning("a batch of %d outcomes was refused; writing one by one", len(batch))
            for item in batch:
                await self._write([item], claiming=False)
        except BaseException as exc:
            fail_batch(batch, exc)
            raise
        else:
            for finish, future in batch:
                if not future.done():
                    future.set_result(finished.get(finish.run_id))
        finally:
            if claim is not None and self._claimed_along is not None:
                self._claimed_along(claim, claimed, sent_at)
