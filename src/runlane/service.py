"""The service layer over the run queue: validation, errors, and the
operations every adapter (CLI, HTTP API, dashboard) calls."""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg.errors import UniqueViolation

from runlane.errors import (
    InvalidInput,
    LaneRefused,
    NotFound,
    NotRetryable,
    PayloadTooLarge,
    RunFinished,
)
from runlane.json_values import json_problem
from runlane.models import Attempt, Event, Run, RunStatus
from runlane.outcomes import MAX_DELAY_SECONDS
from runlane.settings import Settings
from runlane.store import NewRun, RunCursor, RunStore

_AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_BUDGET_KEYS = {"max_seconds", "max_turns"}
MAX_PRIORITY = 1000
MAX_ATTEMPTS_LIMIT = 100
MAX_LIST_LIMIT = 500


def parse_run_id(value: str | UUID) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(value)
    except ValueError:
        raise NotFound(f"no run {value!r}") from None


@dataclass(frozen=True, slots=True)
class RunOptions:
    max_attempts: int
    budget: dict[str, Any]
    # The input's and the metadata's JSON in UTF-8, made by their size
    # check and sent as they are (database.jsonb_param).
    input_json: bytes
    metadata_json: bytes | None


class RunService:
    def __init__(self, store: RunStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings

    async def submit(
        self,
        agent: str,
        input: Any,
        *,
        tenant: str = "default",
        user_id: str = "default",
        priority: int = 0,
        delay_seconds: float = 0.0,
        max_attempts: int | None = None,
        budget: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> tuple[Run, bool]:
        """Stores a run: pending, or already claimed by an idle worker's
        standing claim (then running). Returns it and whether it is new:
        the same idempotency key returns the run it first created."""
        self.check_agent_name(agent)
        checked = self.check_run_options(
            input=input,
            priority=priority,
            max_attempts=max_attempts,
            budget=budget,
            metadata=metadata,
        )
        if not _finite_number(delay_seconds) or not 0 <= delay_seconds <= MAX_DELAY_SECONDS:
            raise InvalidInput(f"delay must be 0 to {MAX_DELAY_SECONDS} seconds")
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str) or not 1 <= len(idempotency_key) <= 200
        ):
            raise InvalidInput("idempotency key must be 1-200 characters")
        return await self.store.insert_run(
            NewRun(
                agent=agent,
                input=input,
                max_attempts=checked.max_attempts,
                tenant=tenant,
                user_id=user_id,
                priority=priority,
                delay_seconds=float(delay_seconds),
                budget=checked.budget,
                idempotency_key=idempotency_key,
                metadata=metadata,
                input_json=checked.input_json,
                metadata_json=checked.metadata_json,
            )
        )

    async def get(
        self, run_id: str | UUID, *, tenant: str | None = None, user_id: str | None = None
    ) -> Run:
        """The run; NotFound too when it is outside the given tenant (or
        user), so that existence never leaks across tenants."""
        parsed = parse_run_id(run_id)
        run = await self.store.get_run(parsed)
        if (
            run is None
            or (tenant is not None and run.tenant != tenant)
            or (user_id is not None and run.user_id != user_id)
        ):
            raise NotFound(f"no run {run_id}")
        return run

    async def list_runs(
        self,
        *,
        tenant: str | None = None,
        user_id: str | None = None,
        thread_id: str | None = None,
        statuses: Sequence[RunStatus] | None = None,
        agent: str | None = None,
        after: RunCursor | None = None,
        limit: int = 50,
    ) -> list[Run]:
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise InvalidInput(f"limit must be between 1 and {MAX_LIST_LIMIT}")
        return await self.store.list_runs(
            tenant=tenant,
            user_id=user_id,
            thread_id=thread_id,
            statuses=statuses,
            agent=agent,
            after=after,
            limit=limit,
        )

    async def cancel(self, run_id: str | UUID, *, tenant: str | None = None) -> Run:
        """Durable cancel. A pending run ends ``cancelled`` at once; a running
        one becomes ``cancel_requested`` and its owner confirms. Cancelling
        again is harmless; cancelling a run that ended otherwise is an error."""
        run = await self.get(run_id, tenant=tenant)
        updated = await self.store.request_cancel(run.id)
        if updated is None:
            raise NotFound(f"no run {run_id}")
        if updated.status.is_terminal and updated.status is not RunStatus.CANCELLED:
            raise RunFinished(f"run {run.id} already ended {updated.status}")
        return updated

    async def requeue(self, run_id: str | UUID, *, tenant: str | None = None) -> Run:
        """Re-queues a failed or dead run: attempts start again, the attempt
        history stays."""
        run = await self.get(run_id, tenant=tenant)
        try:
            updated, requeued = await self.store.requeue_run(run.id)
        except UniqueViolation:
            # runs_one_active_per_lane_idx: another run of its lane is active.
            raise LaneRefused("run_active", f"run {run.id}'s lane has another active run") from None
        if updated is None:
            raise NotFound(f"no run {run_id}")
        if not requeued:
            raise NotRetryable(
                f"run {run.id} is {updated.status}; only failed or dead runs can be re-queued"
            )
        return updated

    async def attempts(self, run_id: str | UUID, *, tenant: str | None = None) -> list[Attempt]:
        run = await self.get(run_id, tenant=tenant)
        return await self.store.list_attempts(run.id)

    async def events(
        self, run_id: str | UUID, *, after_seq: int = 0, tenant: str | None = None
    ) -> list[Event]:
        run = await self.get(run_id, tenant=tenant)
        return await self.store.list_events(run.id, after_seq=after_seq)

    async def follow(
        self,
        run_id: str | UUID,
        *,
        after_seq: int = 0,
        poll_seconds: float = 0.2,
    ) -> AsyncIterator[Event | Run]:
        """Yields the run's events as they come, then the run once it ends.
        Bound it with ``asyncio.timeout`` where needed."""
        run = await self.get(run_id)
        seq = after_seq
        while True:
            for event in await self.store.list_events(run.id, after_seq=seq):
                seq = event.seq
                yield event
            if run.status.is_terminal:
                # Events written before the end are all committed by now.
                for event in await self.store.list_events(run.id, after_seq=seq):
                    seq = event.seq
                    yield event
                yield run
                return
            await asyncio.sleep(poll_seconds)
            run = await self.get(run.id)

    def check_agent_name(self, agent: Any) -> None:
        if not isinstance(agent, str) or not _AGENT_NAME.match(agent):
            raise InvalidInput(
                "agent must be 1-128 letters, digits, '_', '.', ':' or '-', "
                "starting with a letter or digit"
            )

    def check_run_options(
        self,
        *,
        input: Any,
        priority: Any,
        max_attempts: Any,
        budget: Any,
        metadata: Any,
    ) -> RunOptions:
        """Validates what every new run carries; fills in defaults."""
        input_json = self.check_storable(input)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidInput("priority must be an integer")
        if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
            raise InvalidInput(f"priority must be between {-MAX_PRIORITY} and {MAX_PRIORITY}")
        attempts = self.settings.max_attempts if max_attempts is None else max_attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int):
            raise InvalidInput("max_attempts must be an integer")
        if not 1 <= attempts <= MAX_ATTEMPTS_LIMIT:
            raise InvalidInput(f"max_attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}")
        metadata_json = None
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise InvalidInput("metadata must be a JSON object")
            metadata_json = self.check_storable(metadata, what="metadata")
        return RunOptions(
            max_attempts=attempts,
            budget=_check_budget(budget or {}),
            input_json=input_json,
            metadata_json=metadata_json,
        )

    def check_storable(self, value: Any, *, what: str = "input") -> bytes:
        """Refuses a value that could not be stored, or served back (see
        json_values), or that is over max_input_bytes; returns its JSON in
        UTF-8, which its insert may send as it is."""
        problem = json_problem(value)
        if problem is not None:
            raise InvalidInput(f"{what}: {problem}")
        encoded = json.dumps(value, ensure_ascii=False).encode()
        if len(encoded) > self.settings.max_input_bytes:
            raise PayloadTooLarge(
                f"{what} is {len(encoded)} bytes; the limit is {self.settings.max_input_bytes}"
            )
        return encoded


def _finite_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_budget(budget: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(budget, dict):
        raise InvalidInput("budget must be an object")
    unknown = set(budget) - _BUDGET_KEYS
    if unknown:
        raise InvalidInput(f"unknown budget keys: {sorted(unknown)}")
    seconds = budget.get("max_seconds")
    if seconds is not None and (
        not _finite_number(seconds) or not 0 < seconds <= MAX_DELAY_SECONDS
    ):
        raise InvalidInput(f"budget.max_seconds must be a number from 0 to {MAX_DELAY_SECONDS}")
    turns = budget.get("max_turns")
    if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 1):
        raise InvalidInput("budget.max_turns must be an integer >= 1")
    return {k: v for k, v in budget.items() if v is not None}
