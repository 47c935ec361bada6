"""The service layer of lanes: what the HTTP API and the CLI call to submit
requests into threads, read lanes and act on them."""

from __future__ import annotations

import re
import uuid
from typing import Any
from uuid import UUID

from runlane.errors import InvalidInput, NotFound
from runlane.lane_store import LaneStore, NewRequest
from runlane.lanes import LaneKey, LaneSnapshot, Policy, Request
from runlane.models import Run
from runlane.service import RunService

_THREAD_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,199}$")


class LaneService:
    def __init__(self, lanes: LaneStore, runs: RunService) -> None:
        self.lanes = lanes
        self.runs = runs

    def lane_key(self, *, tenant: str, user_id: str, agent: str, thread_id: str) -> LaneKey:
        if not isinstance(thread_id, str) or not _THREAD_ID.match(thread_id):
            raise InvalidInput(
                "thread_id must be 1-200 letters, digits, '_', '.', ':', '@' or '-',"
                " starting with a letter or digit"
            )
        self.runs.check_agent_name(agent)
        return LaneKey(tenant=tenant, user_id=user_id, agent=agent, thread_id=thread_id)

    async def submit(
        self,
        *,
        tenant: str,
        user_id: str,
        agent: str,
        thread_id: str,
        input: Any,
        policy: str | Policy = Policy.ENQUEUE,
        request_id: str | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        budget: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> tuple[Request, bool]:
        """Submits a request into the thread's lane. Returns it (dispatched,
        queued with a position, or rejected with a reason) and whether it is
        new. A refusal that stores nothing raises LaneRefused."""
        key = self.lane_key(tenant=tenant, user_id=user_id, agent=agent, thread_id=thread_id)
        try:
            parsed_policy = Policy(policy)
        except ValueError:
            raise InvalidInput(
                f"policy must be one of {', '.join(p.value for p in Policy)}"
            ) from None
        if request_id is None:
            request_id = str(uuid.uuid4())
        elif not isinstance(request_id, str) or not 1 <= len(request_id) <= 200:
            raise InvalidInput("request_id must be 1-200 characters")
        checked = self.runs.check_run_options(
            input=input,
            priority=priority,
            max_attempts=max_attempts,
            budget=budget,
            metadata=metadata,
        )
        return await self.lanes.submit(
            NewRequest(
                lane=key,
                request_id=request_id,
                policy=parsed_policy,
                input=input,
                max_attempts=checked.max_attempts,
                priority=priority,
                budget=checked.budget,
                metadata=metadata,
                input_json=checked.input_json,
                metadata_json=checked.metadata_json,
            )
        )

    async def get_request(self, *, tenant: str, request_id: str) -> Request:
        return await self.lanes.get_request(tenant, request_id)

    async def snapshot(
        self, *, tenant: str, user_id: str, agent: str, thread_id: str
    ) -> LaneSnapshot:
        key = self.lane_key(tenant=tenant, user_id=user_id, agent=agent, thread_id=thread_id)
        return await self.lanes.snapshot(key)

    async def cancel_request(self, *, tenant: str, request_id: str) -> Request:
        return await self.lanes.cancel_request(tenant, request_id)

    async def promote_to_steer(self, *, tenant: str, request_id: str) -> Request:
        return await self.lanes.promote_to_steer(tenant, request_id)

    async def continue_lane(
        self, *, tenant: str, user_id: str, agent: str, thread_id: str
    ) -> Request:
        key = self.lane_key(tenant=tenant, user_id=user_id, agent=agent, thread_id=thread_id)
        return await self.lanes.continue_lane(key)

    async def resume(
        self, run_id: str | UUID, value: Any, *, tenant: str | None = None
    ) -> tuple[Run, bool]:
        """Resumes an interrupted run with ``value``: a new run (kind
        ``resume``) of the same agent, with the answer and the last
        checkpoint. The same value again returns the same run."""
        run = await self.runs.get(run_id, tenant=tenant)
        self.runs.check_storable(value, what="value")
        return await self.lanes.resume(run, value)

    async def cancel_run(self, run_id: str | UUID, *, tenant: str | None = None) -> Run:
        return await self.runs.cancel(run_id, tenant=tenant)

    async def request_for_run(self, run: Run) -> Request:
        if run.request_id is None:
            raise NotFound(f"run {run.id} belongs to no request")
        return await self.lanes.get_request_by_id(run.request_id)
