"""``runlane runs ...`` and the plumbing every CLI command shares: settings,
a service over a short-lived pool, output through rich, one-line errors."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import importlib
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, TypeVar
from uuid import UUID

import psycopg
import typer
from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from pydantic import ValidationError
from rich import box
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table
from rich.text import Text

from runlane.app import App
from runlane.database import create_pool, resolve_database_url
from runlane.errors import LaneRefused, RunlaneError
from runlane.keys import KeyStore
from runlane.lane_service import LaneService
from runlane.lane_store import LaneStore
from runlane.lanes import Request
from runlane.models import Attempt, Event, Run, RunStatus
from runlane.operations import MAX_BULK, Operations
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import RunStore

T = TypeVar("T")

console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)
for _console in (console, err_console):
    if not _console.is_terminal and "COLUMNS" not in os.environ:
        _console.width = 200  # do not squeeze tables written to a file or a pipe

runs_app = typer.Typer(
    help="List, inspect, cancel, re-queue and resume runs.", no_args_is_help=True
)

STATUS_STYLES = {
    RunStatus.PENDING: "white",
    RunStatus.RUNNING: "blue",
    RunStatus.CANCEL_REQUESTED: "yellow",
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.DEAD: "bold red",
    RunStatus.CANCELLED: "yellow",
    RunStatus.INTERRUPTED: "magenta",
}
# `runs retry --status ...`: runs re-queued per call unless --limit says.
DEFAULT_BULK_LIMIT = 1000
# `submit --wait` exit codes by how the run ended; anything else is 1.
EXIT_CODES = {RunStatus.COMPLETED: 0, RunStatus.INTERRUPTED: 3}


class CliError(Exception):
    """A failure the CLI reports as one line."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


# -- plumbing -----------------------------------------------------------------


def load_settings() -> Settings:
    return Settings()


Pool = AsyncConnectionPool[AsyncConnection[DictRow]]


def _with_pool(work: Callable[[Pool, Settings], Awaitable[T]]) -> T:
    """Runs ``work`` over a short-lived pool on the (migrated) database."""
    settings = load_settings()
    url = resolve_database_url(settings)

    async def go() -> T:
        pool = create_pool(url, min_size=1, max_size=2)
        await pool.open(wait=True, timeout=15)
        try:
            return await work(pool, settings)
        finally:
            await pool.close()

    return asyncio.run(go())


def with_service(work: Callable[[RunService], Awaitable[T]]) -> T:
    """Runs ``work`` with the run service."""
    return _with_pool(lambda pool, settings: work(RunService(RunStore(pool), settings)))


def with_lane_service(work: Callable[[LaneService], Awaitable[T]]) -> T:
    """Runs ``work`` with the lane service (and, through it, the run service)."""
    return _with_pool(
        lambda pool, settings: work(
            LaneService(LaneStore(pool), RunService(RunStore(pool), settings))
        )
    )


def with_key_store(work: Callable[[KeyStore], Awaitable[T]]) -> T:
    """Runs ``work`` with the API key store."""
    return _with_pool(lambda pool, _settings: work(KeyStore(pool)))


class LogLevel(enum.StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


def configure_logging(level: LogLevel) -> None:
    """Log lines on stderr: rich on a terminal, plain with timestamps otherwise."""
    handler: logging.Handler
    if err_console.is_terminal:
        handler = RichHandler(console=err_console, show_path=False)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.value, handlers=[handler], force=True)


def load_app(target: str) -> App:
    """The :class:`runlane.App` named by ``MODULE:APP`` (importable from the
    current directory)."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise CliError(f"expected MODULE:APP (e.g. examples.app:app), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"cannot import {module_name!r}: {exc}") from None
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise CliError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(found, App):
        raise CliError(f"{target} is a {type(found).__name__}, not a runlane.App")
    return found


def report_error(exc: Exception) -> int:
    """Prints ``exc`` as one line on stderr; returns the exit code."""
    code = 1
    if isinstance(exc, CliError):
        message, code = exc.message, exc.exit_code
    elif isinstance(exc, LaneRefused):
        # The refusal code is the stable part: scripts match on it.
        message = exc.message if exc.message.startswith(exc.code) else f"{exc.code}: {exc.message}"
    elif isinstance(exc, RunlaneError):
        message = exc.message
    elif isinstance(exc, ValidationError):
        message = "invalid settings: " + "; ".join(
            (f"RUNLANE_{'_'.join(map(str, e['loc'])).upper()}: " if e["loc"] else "") + e["msg"]
            for e in exc.errors()
        )
    elif isinstance(exc, psycopg.OperationalError | PoolTimeout):
        message = f"cannot reach the database: {exc}"
    elif isinstance(exc, psycopg.Error):
        message = f"database error: {exc}"
    elif isinstance(exc, typer.Abort):
        message = "aborted"
    elif hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
        # A usage error (click's, as vendored by typer).
        if type(exc).__name__ == "NoArgsIsHelpError":
            return 2  # the help is already printed
        code = int(exc.exit_code)
        message = str(exc.format_message())
        ctx = getattr(exc, "ctx", None)
        if ctx is not None:
            message += f" (see '{ctx.command_path} --help')"
    else:
        message = f"{type(exc).__name__}: {exc} (set RUNLANE_DEBUG=1 for the traceback)"
    err_console.print(Text(" ".join(f"error: {message}".split()), style="red"))
    return code


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def record(item: Run | Attempt | Event | Request) -> dict[str, Any]:
    """A JSON-ready dict of a record; lease tokens stay inside runlane."""
    fields = dataclasses.asdict(item)
    fields.pop("lease_token", None)
    result: dict[str, Any] = json.loads(json.dumps(fields, default=_plain))
    return result


def print_json(data: Any) -> None:
    console.print_json(json.dumps(data, default=_plain))


def print_json_line(data: Any) -> None:
    console.print(json.dumps(data, default=_plain), markup=False, highlight=False, emoji=False)


def compact_json(value: Any) -> str:
    return json.dumps(value, default=_plain, ensure_ascii=False)


def format_time(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _status(status: RunStatus) -> Text:
    return Text(str(status), style=STATUS_STYLES.get(status, ""))


def print_event(event: Event) -> None:
    console.print(
        Text.assemble(
            (f"#{event.seq} ", "dim"), (event.kind, "bold cyan"), " ", compact_json(event.data)
        )
    )


def print_run_end(run: Run) -> None:
    line = Text.assemble(f"run {run.id} ", _status(run.status))
    if run.outcome:
        line.append(f" ({run.outcome})")
    if run.status is RunStatus.COMPLETED:
        line.append(f": {compact_json(run.output)}")
    elif run.error:
        line.append(f": {run.error.get('code', 'error')}: {run.error.get('message', '')}")
    console.print(line)


def exit_code_for(run: Run) -> int:
    return EXIT_CODES.get(run.status, 1)


def parse_json_option(text: str, option: str) -> Any:
    """The JSON value of an option (``-`` reads stdin)."""
    if text == "-":
        text = sys.stdin.read()
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CliError(f"{option} is not valid JSON: {exc}") from None


async def follow_run(service: RunService, run: Run, *, as_json: bool) -> int:
    """Prints the run's events as they come and its end; returns the exit
    code for how it ended."""
    async for item in service.follow(run.id):
        if isinstance(item, Run):
            if as_json:
                print_json_line({"type": "run", **record(item)})
            else:
                print_run_end(item)
            return exit_code_for(item)
        if as_json:
            print_json_line({"type": "event", **record(item)})
        else:
            print_event(item)
    raise AssertionError("follow ended without the run")  # pragma: no cover


# -- runs ---------------------------------------------------------------------

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON.")]
RunId = Annotated[str, typer.Argument(metavar="RUN_ID")]


@runs_app.command("list")
def list_runs(
    status: Annotated[
        list[RunStatus] | None, typer.Option("--status", "-s", help="Repeat for several.")
    ] = None,
    agent: Annotated[str | None, typer.Option(help="Only this agent's runs.")] = None,
    tenant: Annotated[
        str | None, typer.Option(help="Only this tenant's runs (default: every tenant).")
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """List runs, newest first (e.g. the dead letter: --status dead)."""
    runs = with_service(
        lambda s: s.list_runs(statuses=status or None, agent=agent, tenant=tenant, limit=limit)
    )
    if as_json:
        print_json([record(run) for run in runs])
        return
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("id", no_wrap=True, min_width=36)
    for name in ("agent", "status", "attempts", "priority", "created"):
        table.add_column(name)
    for run in runs:
        table.add_row(
            str(run.id),
            Text(run.agent),
            _status(run.status),
            f"{run.attempts}/{run.max_attempts}",
            str(run.priority),
            format_time(run.created_at),
        )
    console.print(table if runs else "no runs")


@runs_app.command("show")
def show_run(
    run_id: RunId,
    events: Annotated[int, typer.Option(min=0, help="How many of the last events.")] = 20,
    as_json: JsonFlag = False,
) -> None:
    """Show one run with its attempts and its last events."""

    async def go(service: RunService) -> tuple[Run, list[Attempt], list[Event]]:
        run = await service.get(run_id)
        attempts = await service.attempts(run.id)
        after = max(0, run.last_event_seq - events)
        found = await service.events(run.id, after_seq=after) if events else []
        return run, attempts, found

    run, attempts, found = with_service(go)
    if as_json:
        print_json(
            {
                "run": record(run),
                "attempts": [record(a) for a in attempts],
                "events": [record(e) for e in found],
            }
        )
        return
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows: list[tuple[str, str | Text]] = [
        ("id", str(run.id)),
        ("agent", Text(run.agent)),
        ("status", _status(run.status)),
        ("attempts", f"{run.attempts}/{run.max_attempts}"),
        ("priority", str(run.priority)),
        ("created", format_time(run.created_at)),
        ("available", format_time(run.available_at)),
        ("started", format_time(run.started_at)),
        ("finished", format_time(run.finished_at)),
        ("input", Text(compact_json(run.input))),
    ]
    optional: list[tuple[str, Any]] = [
        ("thread", run.thread_id),
        ("kind", run.kind != "direct" and run.kind),
        ("outcome", run.outcome),
        ("resumed from", run.resumed_from),
        ("resume value", run.resume_value is not None and compact_json(run.resume_value)),
        ("interrupt", run.interrupt is not None and compact_json(run.interrupt)),
        ("interrupt expires", run.interrupt_expires_at and format_time(run.interrupt_expires_at)),
        ("steer requested", run.steer_requested_at and format_time(run.steer_requested_at)),
        ("worker", run.worker_id),
        ("lease expires", run.lease_expires_at and format_time(run.lease_expires_at)),
        ("cancel requested", run.cancel_requested_at and format_time(run.cancel_requested_at)),
        ("idempotency key", run.idempotency_key),
        ("budget", run.budget and compact_json(run.budget)),
        ("output", run.output is not None and compact_json(run.output)),
        ("error", run.error and _describe_error(run.error)),
    ]
    rows += [(name, Text(str(value))) for name, value in optional if value]
    for name, value in rows:
        grid.add_row(name, value)
    console.print(grid)
    if attempts:
        table = Table("#", "worker", "started", "ended", "outcome", "error", box=box.SIMPLE_HEAD)
        for a in attempts:
            table.add_row(
                str(a.attempt),
                Text(a.worker_id),
                format_time(a.started_at),
                format_time(a.ended_at),
                Text(a.outcome or "(running)"),
                Text(_describe_error(a.error) if a.error else ""),
            )
        console.print(table)
    if found:
        console.print(Text(f"last {len(found)} of {run.last_event_seq} events:", style="bold"))
        for event in found:
            print_event(event)


def _describe_error(error: dict[str, Any]) -> str:
    return f"{error.get('code', 'error')}: {error.get('message', '')}".rstrip(": ")


@runs_app.command("cancel")
def cancel_run(run_id: RunId, as_json: JsonFlag = False) -> None:
    """Cancel a run: a pending one at once, a running one at its next safe point."""
    run = with_service(lambda s: s.cancel(run_id))
    if as_json:
        print_json(record(run))
    elif run.status is RunStatus.CANCEL_REQUESTED:
        console.print(Text(f"run {run.id}: cancel requested; it stops at its next safe point"))
    else:
        console.print(Text.assemble(f"run {run.id}: ", _status(run.status)))


@runs_app.command("retry")
def retry_run(
    run_id: Annotated[
        str | None, typer.Argument(metavar="[RUN_ID]", help="The run to re-queue.")
    ] = None,
    status: Annotated[
        list[RunStatus] | None,
        typer.Option(
            "--status",
            "-s",
            help="Without RUN_ID: re-queue in bulk the runs in this status (dead or failed;"
            " repeat for both).",
        ),
    ] = None,
    agent: Annotated[str | None, typer.Option(help="Bulk: only this agent's runs.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Bulk: only this tenant's runs.")] = None,
    limit: Annotated[
        int,
        typer.Option(help=f"Bulk: at most this many runs, newest first (1-{MAX_BULK})."),
    ] = DEFAULT_BULK_LIMIT,
    as_json: JsonFlag = False,
) -> None:
    """Re-queue a failed or dead run (attempts start again; history stays),
    or, with --status and no RUN_ID, every matching run: prints how many were
    re-queued and how many were refused, and why (a lane may refuse)."""
    bulk_options = status or agent is not None or tenant is not None
    if run_id is not None:
        if bulk_options or limit != DEFAULT_BULK_LIMIT:
            raise CliError("give a RUN_ID or --status (bulk), not both")
        run = with_service(lambda s: s.requeue(run_id))
        if as_json:
            print_json(record(run))
        else:
            console.print(Text.assemble(f"run {run.id} re-queued: ", _status(run.status)))
        return
    if not status:
        raise CliError("give a RUN_ID, or --status dead (or failed) to re-queue in bulk")
    done, refused = with_service(
        lambda s: Operations(s).requeue_many(
            statuses=status, agent=agent, tenant=tenant, limit=limit
        )
    )
    more = len(done) + len(refused) == limit
    if as_json:
        print_json(
            {
                "requeued": len(done),
                "refused": len(refused),
                "requeued_ids": [str(run.id) for run in done],
                "refusals": [{"id": str(run.id), "reason": reason} for run, reason in refused],
                "limit_reached": more,
            }
        )
        return
    console.print(f"re-queued {len(done)} runs; refused {len(refused)}")
    for run, reason in refused:
        console.print(Text(f"  refused {run.id} ({run.agent}): {reason}"))
    if more:
        console.print(Text(f"(--limit {limit} reached: more runs may match; run it again)"))


@runs_app.command("resume")
def resume_run(
    run_id: RunId,
    value: Annotated[str, typer.Option("--value", help="The answer as JSON ('-' reads stdin).")],
    as_json: JsonFlag = False,
) -> None:
    """Resume an interrupted run with an answer: prints the id of the new run
    (kind resume). The same answer again returns the same run."""
    answer = parse_json_option(value, "--value")
    run, created = with_lane_service(lambda s: s.resume(run_id, answer))
    if as_json:
        print_json({"created": created, **record(run)})
        return
    console.print(Text(str(run.id)))
    if not created:
        err_console.print(Text(f"(existing resume of run {run.resumed_from}: {run.status})"))
