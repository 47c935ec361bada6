"""/v1/admin: the operator's view for admin keys (their own tenant)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from runlane.api.auth import Admin
from runlane.api.runs_routes import ERRORS, ctx
from runlane.api.schemas import ErrorResponse
from runlane.models import RunStatus
from runlane.operations import Operations

router = APIRouter(prefix="/v1/admin", tags=["admin"])

ADMIN_ERRORS: dict[int | str, dict[str, object]] = {
    403: {"model": ErrorResponse, "description": "Not an admin key."},
    **ERRORS,
}


class TenantOut(BaseModel):
    tenant: str
    max_running: int | None = Field(description="The tenant's cap on running runs; null: none.")
    running: int


class WorkerOut(BaseModel):
    id: str
    hostname: str
    pid: int
    agents: list[str] | None
    concurrency: int
    running: int
    alive: bool
    started_at: datetime
    last_seen_at: datetime
    stopped_at: datetime | None
    run_ids: list[str] = Field(description="Runs of your tenant it holds.")


class LiveCount(BaseModel):
    status: str
    agent: str
    count: int
    oldest_pending_seconds: float | None


class WaitingLane(BaseModel):
    user_id: str
    agent: str
    thread_id: str
    paused_reason: str | None
    paused_run_id: str | None
    interrupted_run_id: str | None
    queued: int


class OverviewOut(BaseModel):
    tenant: str
    live: list[LiveCount]
    oldest_pending_seconds: float | None
    dead: int
    waiting_lanes: list[WaitingLane]


@router.get(
    "/tenant", response_model=TenantOut, summary="Your tenant's cap", responses=ADMIN_ERRORS
)
async def get_tenant(who: Admin, request: Request) -> TenantOut:
    caps = await Operations(ctx(request).runs).tenant_caps(who.tenant)
    if caps:
        return TenantOut(
            tenant=who.tenant, max_running=caps[0]["max_running"], running=caps[0]["running"]
        )
    live = await ctx(request).runs.store.queue_gauges(tenant=who.tenant)
    running = sum(r["count"] for r in live if r["status"] in ("running", "cancel_requested"))
    return TenantOut(tenant=who.tenant, max_running=None, running=running)


@router.get(
    "/workers",
    response_model=list[WorkerOut],
    summary="Workers seen lately, with your tenant's runs they hold",
    responses=ADMIN_ERRORS,
)
async def list_workers(who: Admin, request: Request) -> list[WorkerOut]:
    context = ctx(request)
    workers = await Operations(context.runs).workers()
    mine = {
        run.id
        for run in await context.runs.list_runs(
            tenant=who.tenant,
            statuses=[RunStatus.RUNNING, RunStatus.CANCEL_REQUESTED],
            limit=500,
        )
    }
    out = []
    for row in workers:
        data: dict[str, Any] = dict(row)
        data["run_ids"] = [str(r) for r in row["run_ids"] if r in mine]
        out.append(WorkerOut(**{k: data[k] for k in WorkerOut.model_fields}))
    return out


@router.get(
    "/overview",
    response_model=OverviewOut,
    summary="Your tenant's queues: live runs, oldest pending, dead letter, waiting lanes",
    responses=ADMIN_ERRORS,
)
async def overview(who: Admin, request: Request) -> OverviewOut:
    view = await Operations(ctx(request).runs).overview(tenant=who.tenant)
    return OverviewOut(
        tenant=who.tenant,
        live=[
            LiveCount(
                status=r["status"],
                agent=r["agent"],
                count=r["count"],
                oldest_pending_seconds=r["oldest_pending_seconds"],
            )
            for r in view.live
        ],
        oldest_pending_seconds=view.oldest_pending_seconds,
        dead=view.dead,
        waiting_lanes=[
            WaitingLane(
                user_id=lane["user_id"],
                agent=lane["agent"],
                thread_id=lane["thread_id"],
                paused_reason=lane["paused_reason"],
                paused_run_id=str(lane["paused_run_id"]) if lane["paused_run_id"] else None,
                interrupted_run_id=(
                    str(lane["interrupted_run_id"]) if lane["interrupted_run_id"] else None
                ),
                queued=lane["queued"],
            )
            for lane in view.waiting_lanes
        ],
    )
