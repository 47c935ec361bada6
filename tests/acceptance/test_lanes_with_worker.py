"""Lanes end to end with a real worker: order, steer, interrupt and resume."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from runlane import App, RunContext
from runlane.demo import app as demo_app
from runlane.lane_service import LaneService
from runlane.lanes import LaneState, RequestStatus
from runlane.models import RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from tests.integration.lane_helpers import TENANT, USER
from tests.support import running_worker, wait_until


async def submit_to(lanes: LaneService, agent: str, thread: str, payload: Any, **kw: Any) -> Any:
    request, _ = await lanes.submit(
        tenant=TENANT, user_id=USER, agent=agent, thread_id=thread, input=payload, **kw
    )
    return request


async def test_three_requests_run_one_after_another_in_order(
    lanes: LaneService, service: RunService, settings: Settings
) -> None:
    requests = [
        await submit_to(
            lanes, "demo", "chat", {"text": f"reply {i}", "turns": 1, "token_delay": 0.01}
        )
        for i in (1, 2, 3)
    ]
    assert [r.status for r in requests] == [
        RequestStatus.DISPATCHED,
        RequestStatus.QUEUED,
        RequestStatus.QUEUED,
    ]
    async with running_worker(demo_app, settings, concurrency=4):

        async def all_done() -> Any:
            current = [
                await lanes.get_request(tenant=TENANT, request_id=r.request_id) for r in requests
            ]
            if any(r.run_id is None for r in current):
                return None
            runs = [await service.get(r.run_id) for r in current]  # type: ignore[arg-type]
            return runs if all(run.status is RunStatus.COMPLETED for run in runs) else None

        runs = await wait_until(all_done, timeout=30, message="three runs completed")
    # request 1 -> run 1 -> request 2 -> run 2 -> request 3 -> run 3
    assert [run.input["text"] for run in runs] == ["reply 1", "reply 2", "reply 3"]
    for earlier, later in itertools.pairwise(runs):
        assert earlier.finished_at is not None and later.started_at is not None
        assert earlier.finished_at <= later.started_at
        assert earlier.created_at < later.created_at


async def test_a_steer_ends_the_running_reply_at_its_safe_point(
    lanes: LaneService, service: RunService, settings: Settings
) -> None:
    app = App(settings)
    in_tool = asyncio.Event()
    tool_finished = asyncio.Event()

    @app.agent("chat")
    async def chat(ctx: RunContext) -> Any:
        if ctx.input.get("slow_tool"):
            await ctx.safe_point()  # before the model call
            in_tool.set()
            # A tool call in progress: a steer never forces it to stop.
            await asyncio.sleep(0.5)
            tool_finished.set()
            while True:
                await ctx.safe_point()  # after a model turn with no tool calls
                await asyncio.sleep(0.02)
        return {"answered": ctx.input["text"]}

    first = await submit_to(lanes, "chat", "t", {"text": "long", "slow_tool": True})
    queued = await submit_to(lanes, "chat", "t", {"text": "queued"})
    async with running_worker(app, settings):
        await asyncio.wait_for(in_tool.wait(), 10)
        steer = await submit_to(lanes, "chat", "t", {"text": "steer!"}, policy="steer")
        assert steer.status is RequestStatus.QUEUED and steer.position == 1
        steered = await wait_until(
            lambda: _run_in(service, first.run_id, RunStatus.COMPLETED), message="steered"
        )
        assert steered.outcome == "steered" and tool_finished.is_set()
        steer_request = await wait_until(
            lambda: _dispatched(lanes, steer.request_id), message="steer dispatched"
        )
        steer_run = await wait_until(
            lambda: _run_in(service, steer_request.run_id, RunStatus.COMPLETED), message="steer"
        )
        assert steer_run.output == {"answered": "steer!"}
        # ...and the queued request runs after the steer.
        queued_request = await wait_until(
            lambda: _dispatched(lanes, queued.request_id), message="queued dispatched"
        )
        done = await wait_until(
            lambda: _run_in(service, queued_request.run_id, RunStatus.COMPLETED),
            message="queued run",
        )
        assert done.started_at >= steer_run.finished_at  # type: ignore[operator]


async def test_interrupt_then_resume_with_the_answer(
    lanes: LaneService, service: RunService, settings: Settings
) -> None:
    app = App(settings)

    @app.agent("approver")
    async def approver(ctx: RunContext) -> Any:
        if ctx.resume_value is None:
            await ctx.save_checkpoint({"drafted": True})
            await ctx.interrupt({"ask": "send the mail?"})
        return {"approved": ctx.resume_value, "checkpoint": ctx.checkpoint}

    request = await submit_to(lanes, "approver", "t", {"to": "bob"})
    async with running_worker(app, settings):
        interrupted = await wait_until(
            lambda: _run_in(service, request.run_id, RunStatus.INTERRUPTED), message="interrupt"
        )
        assert interrupted.interrupt == {"ask": "send the mail?"}
        snap = await snapshot_of(lanes, "approver", "t")
        assert snap.state is LaneState.INTERRUPTED
        resume, _ = await lanes.resume(interrupted.id, {"yes": True})
        done = await wait_until(
            lambda: _run_in(service, resume.id, RunStatus.COMPLETED), message="resumed run"
        )
    assert done.output == {"approved": {"yes": True}, "checkpoint": {"drafted": True}}
    assert (await snapshot_of(lanes, "approver", "t")).state is LaneState.IDLE


async def snapshot_of(lanes: LaneService, agent: str, thread: str) -> Any:
    return await lanes.snapshot(tenant=TENANT, user_id=USER, agent=agent, thread_id=thread)


async def _run_in(service: RunService, run_id: Any, status: RunStatus) -> Any:
    run = await service.get(run_id)
    return run if run.status is status else None


async def _dispatched(lanes: LaneService, request_id: str) -> Any:
    request = await lanes.get_request(tenant=TENANT, request_id=request_id)
    return request if request.status is RequestStatus.DISPATCHED else None
