"""The operator's commands: ``runlane status``, ``workers``, ``tenants ...``
and ``prune``, thin over :class:`runlane.operations.Operations`.

These see every tenant (the CLI talks to the database directly); ``--tenant``
narrows a view, it never comes from ``$RUNLANE_TENANT``. Each prints JSON with
``--json``; errors are one line on stderr and a non-zero exit.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import typer
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from runlane.cli_runs import (
    STATUS_STYLES,
    CliError,
    JsonFlag,
    console,
    format_time,
    print_json,
    with_service,
)
from runlane.models import RunStatus
from runlane.operations import Operations, QueueOverview

T = TypeVar("T")

tenants_app = typer.Typer(
    help="Per-tenant caps on running runs (default: no cap).", no_args_is_help=True
)

LIVE_STATUSES = ("pending", "running", "cancel_requested")
# How many run ids a worker row shows in `runlane status` before "+N".
SHOWN_RUN_IDS = 3

TenantFilter = Annotated[
    str | None,
    typer.Option(
        "--tenant",
        help="Only this tenant's runs, lanes and cap (default: every tenant; workers are"
        " shown whole).",
    ),
]


def with_operations(work: Callable[[Operations], Awaitable[T]]) -> T:
    """Runs ``work`` with the operations layer over a short-lived pool."""
    return with_service(lambda service: work(Operations(service)))


# -- durations ------------------------------------------------------------------

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a number of seconds (``3600``) or amounts with
    units s, m, h, d, w (``7d``, ``12h``, ``30m``, ``1h30m``)."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return float(value)
    if value and re.fullmatch(rf"(?:{_PART.pattern})+", value):
        return sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(value))
    raise CliError(
        f"--older-than: expected a duration such as 7d, 12h, 30m, 1h30m or 3600 (seconds),"
        f" got {text!r}"
    )


def _seconds(value: Any) -> float | None:
    """Ages come from ``extract(epoch ...)`` as Decimal: JSON wants floats."""
    return None if value is None else float(value)


def format_age(seconds: float | None) -> str:
    """``45s``, ``3m12s``, ``2h05m``, ``3d04h``; ``-`` for none."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{max(seconds, 0.0):.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


# -- records ------------------------------------------------------------------


def _worker_state(row: dict[str, Any]) -> str:
    """alive; stopped (shut down cleanly); gone (stopped heartbeating)."""
    if row["alive"]:
        return "alive"
    return "stopped" if row["stopped_at"] is not None else "gone"


def worker_record(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "hostname": row["hostname"],
        "pid": row["pid"],
        "agents": row["agents"],
        "concurrency": row["concurrency"],
        "state": _worker_state(row),
        "alive": bool(row["alive"]),
        "running": len(row["run_ids"]),
        "run_ids": [str(run_id) for run_id in row["run_ids"]],
        "started_at": row["started_at"],
        "last_seen_at": row["last_seen_at"],
        "stopped_at": row["stopped_at"],
    }


def _lane_record(row: dict[str, Any]) -> dict[str, Any]:
    paused = row["paused_run_id"] is not None
    return {
        "state": "paused" if paused else "interrupted",
        "tenant": row["tenant"],
        "user_id": row["user_id"],
        "agent": row["agent"],
        "thread_id": row["thread_id"],
        "paused_reason": row["paused_reason"],
        "run_id": str(row["paused_run_id"] if paused else row["interrupted_run_id"]),
        "queued": int(row["queued"]),
    }


def _cap_record(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "tenant": row["tenant"],
        "max_running": row["max_running"],
        "running": int(row["running"]),
    }


def status_record(
    overview: QueueOverview, caps: list[dict[str, Any]], tenant: str | None
) -> dict[str, Any]:
    totals = dict.fromkeys(LIVE_STATUSES, 0)
    for row in overview.live:
        totals[row["status"]] = totals.get(row["status"], 0) + int(row["count"])
    workers = [worker_record(row) for row in overview.workers]
    return {
        "tenant": tenant,
        "totals": totals,
        "oldest_pending_seconds": _seconds(overview.oldest_pending_seconds),
        "dead": overview.dead,
        "live": [
            {
                "status": row["status"],
                "agent": row["agent"],
                "tenant": row["tenant"],
                "count": int(row["count"]),
                "oldest_pending_seconds": _seconds(row["oldest_pending_seconds"]),
            }
            for row in overview.live
        ],
        "workers_alive": sum(1 for w in workers if w["alive"]),
        "workers": workers,
        "waiting_lanes": [_lane_record(row) for row in overview.waiting_lanes],
        "tenant_caps": [_cap_record(row) for row in caps],
    }


# -- rendering ------------------------------------------------------------------


def _status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLES.get(RunStatus(status), ""))


def _run_ids(ids: list[str], *, short: bool) -> str:
    if not short:
        return "\n".join(ids)
    shown = [run_id[:8] for run_id in ids[:SHOWN_RUN_IDS]]
    more = len(ids) - len(shown)
    return ", ".join(shown) + (f" +{more}" if more > 0 else "")


def workers_table(workers: list[dict[str, Any]], *, short_ids: bool) -> Table:
    table = Table(box=box.SIMPLE_HEAD)
    for name in ("worker", "state", "running", "agents", "last seen", "runs"):
        table.add_column(name, no_wrap=name in ("worker", "last seen"))
    styles = {"alive": "green", "stopped": "dim", "gone": "red"}
    for w in workers:
        table.add_row(
            Text(w["id"]),
            Text(w["state"], style=styles[w["state"]]),
            f"{w['running']}/{w['concurrency']}",
            Text(",".join(w["agents"]) if w["agents"] is not None else "(all)"),
            format_time(w["stopped_at"] or w["last_seen_at"]),
            Text(_run_ids(w["run_ids"], short=short_ids)),
        )
    return table


def render_status(data: dict[str, Any]) -> RenderableType:
    parts: list[RenderableType] = []
    totals = data["totals"]
    scope = f" (tenant {data['tenant']})" if data["tenant"] else ""
    head = Text.assemble(("runs" + scope + ": ", "bold"))
    for status in LIVE_STATUSES:
        head.append_text(_status_text(status))
        head.append(f" {totals.get(status, 0)}  ")
    head.append("dead letter ")
    head.append(str(data["dead"]), style="bold red" if data["dead"] else "")
    head.append("  oldest pending ")
    head.append(format_age(data["oldest_pending_seconds"]))
    parts.append(head)

    if data["live"]:
        live = Table(box=box.SIMPLE_HEAD)
        for name in ("status", "agent", "tenant", "runs", "oldest pending"):
            live.add_column(name, justify="right" if name == "runs" else "left")
        for row in data["live"]:
            live.add_row(
                _status_text(row["status"]),
                Text(row["agent"]),
                Text(row["tenant"]),
                str(row["count"]),
                format_age(row["oldest_pending_seconds"]),
            )
        parts.append(live)
    else:
        parts.append(Text("no live runs", style="dim"))

    workers = data["workers"]
    gone = sum(1 for w in workers if w["state"] == "gone")
    line = Text.assemble(("workers: ", "bold"), f"{data['workers_alive']} alive")
    if gone:
        line.append(f", {gone} gone (stopped heartbeating)", style="red")
    parts.append(line)
    shown = [w for w in workers if w["state"] != "stopped"]
    if shown:
        parts.append(workers_table(shown, short_ids=True))

    lanes = data["waiting_lanes"]
    paused = sum(1 for lane in lanes if lane["state"] == "paused")
    parts.append(
        Text.assemble(
            ("lanes waiting: ", "bold"),
            f"{paused} paused, {len(lanes) - paused} interrupted",
        )
    )
    if lanes:
        table = Table(box=box.SIMPLE_HEAD)
        for name in ("state", "tenant", "user", "agent", "thread", "reason", "queued", "run"):
            table.add_column(name)
        for lane in lanes:
            table.add_row(
                Text(lane["state"], style="yellow" if lane["state"] == "paused" else "magenta"),
                Text(lane["tenant"]),
                Text(lane["user_id"]),
                Text(lane["agent"]),
                Text(lane["thread_id"]),
                Text(lane["paused_reason"] or "-"),
                str(lane["queued"]),
                Text(lane["run_id"]),
            )
        parts.append(table)

    if data["tenant_caps"]:
        parts.append(Text("tenant caps:", style="bold"))
        parts.append(caps_table(data["tenant_caps"]))
    return Group(*parts)


def caps_table(caps: list[dict[str, Any]], *, pending: bool = False) -> Table:
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("tenant")
    table.add_column("max running", justify="right")
    table.add_column("running", justify="right")
    if pending:
        table.add_column("pending", justify="right")
    for cap in caps:
        limit = cap["max_running"]
        at_cap = limit is not None and cap["running"] >= limit
        cells: list[str | Text] = [
            Text(cap["tenant"]),
            "unlimited" if limit is None else str(limit),
            Text(str(cap["running"]), style="bold yellow" if at_cap else ""),
        ]
        if pending:
            cells.append(str(cap["pending"]))
        table.add_row(*cells)
    return table


# -- commands -------------------------------------------------------------------


def status(tenant: TenantFilter = None, as_json: JsonFlag = False) -> None:
    """Overview: live runs by status, agent and tenant, the oldest pending
    run's age, the dead letter, workers alive with their runs, paused and
    interrupted lanes, tenant caps."""

    async def go(ops: Operations) -> dict[str, Any]:
        overview = await ops.overview(tenant=tenant)
        caps = await ops.tenant_caps(tenant)
        return status_record(overview, caps, tenant)

    data = with_operations(go)
    if as_json:
        print_json(data)
    else:
        console.print(render_status(data))


def workers(
    alive: Annotated[
        bool, typer.Option("--alive", help="Only workers that heartbeat now.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Workers seen lately: alive, stopped (within the last hour) or gone
    (stopped heartbeating without shutting down), with the runs they hold."""
    rows = [worker_record(row) for row in with_operations(lambda ops: ops.workers())]
    if alive:
        rows = [row for row in rows if row["alive"]]
    if as_json:
        print_json(rows)
    elif rows:
        console.print(workers_table(rows, short_ids=False))
    else:
        console.print("no workers")


def prune(
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            metavar="DURATION",
            help="Delete finished runs of every status that ended longer ago than this"
            " (7d, 12h, 30m, 1h30m, or seconds). Default: the retention settings"
            " (RUNLANE_RETENTION_SECONDS, RUNLANE_RETENTION_BY_STATUS).",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Delete finished runs (completed, failed, dead, cancelled) past their
    retention, with their attempts, events and effects, and ended requests,
    in small batches. Interrupted and live runs are never deleted."""
    seconds = parse_duration(older_than) if older_than is not None else None
    runs, requests = with_operations(lambda ops: ops.prune(seconds))
    if as_json:
        print_json({"runs": runs, "requests": requests, "older_than_seconds": seconds})
    else:
        console.print(f"deleted {runs} runs and {requests} requests")


@tenants_app.command("set")
def set_tenant(
    tenant: Annotated[str, typer.Argument(metavar="TENANT")],
    max_running: Annotated[
        int | None,
        typer.Option(
            "--max-running",
            min=0,
            help="At most this many of the tenant's runs run at once (0 holds them all).",
        ),
    ] = None,
    unlimited: Annotated[
        bool, typer.Option("--unlimited", help="Remove the tenant's cap.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Cap how many of a tenant's runs may run at once, or remove the cap.
    Workers never claim past the cap; runs already running go on."""
    if (max_running is None) == (not unlimited):
        raise CliError("give either --max-running N or --unlimited")

    async def go(ops: Operations) -> dict[str, Any]:
        await ops.set_tenant_cap(tenant, max_running)
        caps = await ops.tenant_caps(tenant)
        if caps:
            return _cap_record(caps[0])
        running = sum(
            int(row["count"])
            for row in await ops.store.queue_gauges(tenant=tenant)
            if row["status"] != "pending"
        )
        return {"tenant": tenant, "max_running": None, "running": running}

    cap = with_operations(go)
    if as_json:
        print_json(cap)
    elif cap["max_running"] is None:
        console.print(Text(f"tenant {tenant}: no cap ({cap['running']} running)"))
    else:
        console.print(
            Text(
                f"tenant {tenant}: at most {cap['max_running']} running"
                f" ({cap['running']} running now)"
            )
        )


@tenants_app.command("list")
def list_tenants(as_json: JsonFlag = False) -> None:
    """Tenants with a cap, and tenants with live runs (uncapped: unlimited),
    with their running and pending counts."""

    async def go(ops: Operations) -> list[dict[str, Any]]:
        caps = {row["tenant"]: row["max_running"] for row in await ops.tenant_caps()}
        counts: dict[str, dict[str, int]] = {}
        for row in await ops.store.queue_gauges():
            tenant_counts = counts.setdefault(row["tenant"], {"running": 0, "pending": 0})
            key = "pending" if row["status"] == "pending" else "running"
            tenant_counts[key] += int(row["count"])
        return [
            {
                "tenant": name,
                "max_running": caps.get(name),
                **counts.get(name, {"running": 0, "pending": 0}),
            }
            for name in sorted(set(caps) | set(counts))
        ]

    rows = with_operations(go)
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("no capped tenants and no live runs")
        return
    console.print(caps_table(rows, pending=True))
