"""``runlane lanes ...``, ``runlane requests ...`` and ``runlane submit
--thread``: thin adapters over :class:`LaneService`.

A lane is (tenant, user, agent, thread). The tenant and the user come from
``--tenant`` / ``--user``, else ``RUNLANE_TENANT`` / ``RUNLANE_USER``, else
``default``. A rejected request is a normal result (exit 0); a refusal
(``LaneRefused``) is a one-line error naming its code (exit 1).
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from runlane.cli_runs import (
    CliError,
    JsonFlag,
    compact_json,
    console,
    err_console,
    follow_run,
    format_time,
    print_json,
    print_json_line,
    record,
    with_lane_service,
)
from runlane.lane_service import LaneService
from runlane.lanes import LaneSnapshot, LaneState, Policy, Request, RequestStatus

DEFAULT_SCOPE = "default"
TENANT_ENV = "RUNLANE_TENANT"
USER_ENV = "RUNLANE_USER"
# `submit --thread --wait`: the request was rejected, so no run ever started.
EXIT_REJECTED = 4
REQUEST_POLL_SECONDS = 0.2

lanes_app = typer.Typer(help="Show and continue a thread's lane.", no_args_is_help=True)
requests_app = typer.Typer(
    help="Show, cancel and steer requests submitted into threads.", no_args_is_help=True
)

REQUEST_STYLES = {
    RequestStatus.QUEUED: "white",
    RequestStatus.DISPATCHED: "blue",
    RequestStatus.CANCELLED: "yellow",
    RequestStatus.REJECTED: "magenta",
    RequestStatus.FAILED: "red",
}
LANE_STYLES = {
    LaneState.IDLE: "white",
    LaneState.RUNNING: "blue",
    LaneState.INTERRUPTED: "magenta",
    LaneState.PAUSED: "yellow",
}
# Human words for rejection reasons and pause reasons (the codes stay stable).
REASONS = {
    "lane_busy": "the lane has an active run",
    "queue_not_empty": "requests are waiting in the lane",
    "lane_paused": "the lane is paused",
    "run_interrupted": "the lane's run is interrupted",
    "run_failed": "its run failed",
    "run_dead": "its run exhausted its attempts",
    "run_cancelled": "its run was cancelled",
}

TenantOption = Annotated[
    str | None,
    typer.Option("--tenant", help=f"Default: ${TENANT_ENV}, else '{DEFAULT_SCOPE}'."),
]
UserOption = Annotated[
    str | None,
    typer.Option("--user", help=f"Default: ${USER_ENV}, else '{DEFAULT_SCOPE}'."),
]
AgentOption = Annotated[
    str,
    typer.Option(
        "--agent", "-a", help="The lane's agent (a lane is tenant, user, agent and thread)."
    ),
]
ThreadArgument = Annotated[str, typer.Argument(metavar="THREAD", help="The thread id.")]
RequestIdArgument = Annotated[str, typer.Argument(metavar="REQUEST_ID")]


def tenant_of(option: str | None) -> str:
    return option or os.environ.get(TENANT_ENV) or DEFAULT_SCOPE


def user_of(option: str | None) -> str:
    return option or os.environ.get(USER_ENV) or DEFAULT_SCOPE


# -- output ---------------------------------------------------------------------


def describe(request: Request) -> Text:
    """Where a request stands, in words: ``queued at position 2``,
    ``dispatched as run ...``, ``rejected: lane_busy (...)``."""
    status = Text(str(request.status), style=REQUEST_STYLES.get(request.status, ""))
    if request.status is RequestStatus.QUEUED:
        line = Text.assemble(status, f" at position {request.position}")
        if request.steer:
            line.append(" (steer)")
        return line
    if request.status is RequestStatus.DISPATCHED:
        return Text.assemble(status, f" as run {request.run_id}")
    if request.reason:
        words = REASONS.get(request.reason)
        return Text.assemble(status, f": {request.reason}" + (f" ({words})" if words else ""))
    return status


def lane_record(snapshot: LaneSnapshot) -> dict[str, Any]:
    key = snapshot.key
    return {
        "tenant": key.tenant,
        "user_id": key.user_id,
        "agent": key.agent,
        "thread_id": key.thread_id,
        "state": str(snapshot.state),
        "paused_reason": snapshot.paused_reason,
        "run_id": None if snapshot.run_id is None else str(snapshot.run_id),
        "queued": [record(request) for request in snapshot.queued],
    }


def _print_request(request: Request, *, as_json: bool, created: bool | None = None) -> None:
    if as_json:
        extra = {} if created is None else {"created": created}
        print_json({**extra, **record(request)})
    else:
        console.print(Text.assemble(f"request {request.request_id} ", describe(request)))


# -- submit --thread --------------------------------------------------------------


def submit_to_thread(
    *,
    agent: str,
    thread: str,
    payload: Any,
    policy: Policy,
    request_id: str | None,
    user: str | None,
    tenant: str | None,
    priority: int,
    max_attempts: int | None,
    budget: dict[str, Any] | None,
    wait: bool,
    timeout: float | None,
    as_json: bool,
) -> int:
    """``runlane submit AGENT --thread T``: prints the request id and where
    it stands; with ``wait``, follows it to its run's end. Returns the exit
    code."""

    async def go(service: LaneService) -> int:
        request, created = await service.submit(
            tenant=tenant_of(tenant),
            user_id=user_of(user),
            agent=agent,
            thread_id=thread,
            input=payload,
            policy=policy,
            request_id=request_id,
            priority=priority,
            max_attempts=max_attempts,
            budget=budget,
        )
        if as_json:
            print_json_line({"type": "request", "created": created, **record(request)})
        else:
            console.print(Text(request.request_id))
            console.print(describe(request))
            if not created:
                err_console.print(Text("(existing request for this request id)"))
        if not wait:
            return 0
        try:
            async with asyncio.timeout(timeout):
                return await _follow_request(service, request, as_json=as_json)
        except TimeoutError:
            raise CliError(
                f"timed out after {timeout:g}s; {await _still(service, request)}"
            ) from None

    return with_lane_service(go)


async def _follow_request(service: LaneService, request: Request, *, as_json: bool) -> int:
    """Prints the request's position changes until it leaves the queue, then
    follows its run to the end."""
    shown = request
    while request.status is RequestStatus.QUEUED:
        await asyncio.sleep(REQUEST_POLL_SECONDS)
        request = await service.get_request(tenant=request.tenant, request_id=request.request_id)
        if (request.status, request.position, request.steer) != (
            shown.status,
            shown.position,
            shown.steer,
        ):
            if as_json:
                print_json_line({"type": "request", **record(request)})
            else:
                console.print(describe(request))
            shown = request
    if request.status is RequestStatus.DISPATCHED:
        assert request.run_id is not None
        run = await service.runs.get(request.run_id)
        return await follow_run(service.runs, run, as_json=as_json)
    return EXIT_REJECTED if request.status is RequestStatus.REJECTED else 1


async def _still(service: LaneService, request: Request) -> str:
    current = await service.get_request(tenant=request.tenant, request_id=request.request_id)
    if current.run_id is not None:
        run = await service.runs.get(current.run_id)
        return f"run {run.id} is still {run.status}"
    return f"request {current.request_id} is still {describe(current).plain}"


# -- lanes ------------------------------------------------------------------------


@lanes_app.command("show")
def show_lane(
    thread: ThreadArgument,
    agent: AgentOption,
    user: UserOption = None,
    tenant: TenantOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Show a lane: its state, its run and its queued requests in order."""
    snapshot = with_lane_service(
        lambda s: s.snapshot(
            tenant=tenant_of(tenant), user_id=user_of(user), agent=agent, thread_id=thread
        )
    )
    if as_json:
        print_json(lane_record(snapshot))
        return
    key = snapshot.key
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("thread", Text(key.thread_id))
    grid.add_row("agent", Text(key.agent))
    grid.add_row("user", Text(key.user_id))
    grid.add_row("tenant", Text(key.tenant))
    state = Text(str(snapshot.state), style=LANE_STYLES.get(snapshot.state, ""))
    if snapshot.paused_reason:
        words = REASONS.get(snapshot.paused_reason)
        state.append(f": {snapshot.paused_reason}" + (f" ({words})" if words else ""))
    grid.add_row("state", state)
    if snapshot.run_id is not None:
        label = {
            LaneState.RUNNING: "active run",
            LaneState.PAUSED: "paused by run",
            LaneState.INTERRUPTED: "interrupted run",
        }.get(snapshot.state, "run")
        grid.add_row(label, str(snapshot.run_id))
    grid.add_row("queued", str(len(snapshot.queued)))
    console.print(grid)
    if snapshot.queued:
        table = Table("position", "request id", "policy", "steer", "created", "input")
        table.box = box.SIMPLE_HEAD
        for request in snapshot.queued:
            table.add_row(
                str(request.position),
                Text(request.request_id),
                str(request.policy),
                "yes" if request.steer else "",
                format_time(request.created_at),
                Text(compact_json(request.input)),
            )
        console.print(table)


@lanes_app.command("continue")
def continue_lane(
    thread: ThreadArgument,
    agent: AgentOption,
    user: UserOption = None,
    tenant: TenantOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Dispatch the head of a paused lane (only the head)."""
    request = with_lane_service(
        lambda s: s.continue_lane(
            tenant=tenant_of(tenant), user_id=user_of(user), agent=agent, thread_id=thread
        )
    )
    _print_request(request, as_json=as_json)


# -- requests ---------------------------------------------------------------------


@requests_app.command("show")
def show_request(
    request_id: RequestIdArgument, tenant: TenantOption = None, as_json: JsonFlag = False
) -> None:
    """Show one request, with its live position while queued."""
    request = with_lane_service(
        lambda s: s.get_request(tenant=tenant_of(tenant), request_id=request_id)
    )
    if as_json:
        print_json(record(request))
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows: list[tuple[str, str | Text]] = [
        ("request id", Text(request.request_id)),
        ("status", describe(request)),
        ("thread", Text(request.thread_id)),
        ("agent", Text(request.agent)),
        ("user", Text(request.user_id)),
        ("tenant", Text(request.tenant)),
        ("policy", str(request.policy) + (" (steer)" if request.steer else "")),
        ("priority", str(request.priority)),
        ("created", format_time(request.created_at)),
    ]
    if request.dispatched_at:
        rows.append(("dispatched", format_time(request.dispatched_at)))
    if request.ended_at:
        rows.append(("ended", format_time(request.ended_at)))
    rows.append(("input", Text(compact_json(request.input))))
    if request.metadata:
        rows.append(("metadata", Text(compact_json(request.metadata))))
    for name, value in rows:
        grid.add_row(name, value)
    console.print(grid)


@requests_app.command("cancel")
def cancel_request(
    request_id: RequestIdArgument, tenant: TenantOption = None, as_json: JsonFlag = False
) -> None:
    """Cancel a queued request; the requests behind it move up. A dispatched
    request is refused: cancel its run (runs cancel) instead."""
    request = with_lane_service(
        lambda s: s.cancel_request(tenant=tenant_of(tenant), request_id=request_id)
    )
    _print_request(request, as_json=as_json)


@requests_app.command("steer")
def steer_request(
    request_id: RequestIdArgument, tenant: TenantOption = None, as_json: JsonFlag = False
) -> None:
    """Promote a queued request to the lane's steer: it goes first, and the
    active run yields to it at its next safe point."""
    request = with_lane_service(
        lambda s: s.promote_to_steer(tenant=tenant_of(tenant), request_id=request_id)
    )
    _print_request(request, as_json=as_json)
