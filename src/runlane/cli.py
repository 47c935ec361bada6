"""The ``runlane`` command line: a thin adapter over :class:`RunService`,
:class:`LaneService` and :class:`Operations` (``runlane.cli_runs``,
``runlane.cli_lanes``, ``runlane.cli_ops``).

Every command that needs the database resolves it on start-up (the embedded
server when ``RUNLANE_DATABASE_URL`` is unset) and applies pending
migrations. Errors print one line on stderr and exit non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from typing import Annotated

import typer
from rich.text import Text

from runlane.cli_api import DEFAULT_HOST, DEFAULT_PORT, keys_app
from runlane.cli_api import serve as serve_command
from runlane.cli_lanes import lanes_app, requests_app, submit_to_thread, tenant_of
from runlane.cli_ops import prune, status, tenants_app, workers
from runlane.cli_runs import (
    CliError,
    LogLevel,
    configure_logging,
    console,
    err_console,
    follow_run,
    load_app,
    load_settings,
    parse_json_option,
    print_json_line,
    record,
    report_error,
    runs_app,
    with_service,
)
from runlane.database import embedded_server, resolve_database_url
from runlane.lanes import Policy
from runlane.migrations import migrate as apply_migrations
from runlane.service import RunService
from runlane.worker import Worker

logger = logging.getLogger("runlane.cli")

app = typer.Typer(
    name="runlane",
    help="Durable runs for AI agents on PostgreSQL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="The embedded PostgreSQL server.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")
app.add_typer(lanes_app, name="lanes")
app.add_typer(requests_app, name="requests")
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")
app.add_typer(tenants_app, name="tenants")
# The operator's views and levers (runlane.cli_ops).
app.command("status")(status)
app.command("workers")(workers)
app.command("prune")(prune)


# -- migrate ------------------------------------------------------------------


@app.command()
def migrate() -> None:
    """Apply pending schema migrations (each once, under an advisory lock)."""
    settings = load_settings()
    url = resolve_database_url(settings, apply_migrations=False)
    applied = apply_migrations(url)
    for migration in applied:
        console.print(Text(f"applied {migration.version:04d}_{migration.name}"))
    if not applied:
        console.print("schema is up to date")


# -- worker -------------------------------------------------------------------


@app.command()
def worker(
    target: Annotated[
        str, typer.Argument(metavar="MODULE:APP", help="Where the App is, e.g. examples.app:app")
    ],
    concurrency: Annotated[int, typer.Option(min=1, help="Runs worked on at once.")] = 10,
    agents: Annotated[
        str | None, typer.Option(help="Comma-separated agents to serve (default: all).")
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=65535,
            help="Serve Prometheus metrics on this port (http://0.0.0.0:PORT/metrics).",
        ),
    ] = None,
    log_level: Annotated[LogLevel, typer.Option(case_sensitive=False)] = LogLevel.INFO,
) -> None:
    """Serve an App's agents until SIGTERM or SIGINT."""
    configure_logging(log_level)
    if metrics_port is not None:
        _check_port_free(metrics_port)
    runlane_app = load_app(target)
    serve: list[str] | None = None
    if agents is not None:
        serve = [name.strip() for name in agents.split(",") if name.strip()]
        unknown = sorted(set(serve) - set(runlane_app.agents))
        if not serve or unknown:
            raise CliError(f"--agents names agents the app does not have: {unknown or agents!r}")
    settings = runlane_app.settings
    url = resolve_database_url(settings)
    runner = Worker(
        runlane_app,
        url,
        concurrency=concurrency,
        settings=settings,
        agents=serve,
        metrics_port=metrics_port,
    )
    logger.info("serving agents: %s", ", ".join(serve or sorted(runlane_app.agents)) or "(none)")
    if metrics_port is not None:
        logger.info("metrics on http://0.0.0.0:%d/metrics", metrics_port)
    asyncio.run(runner.run_until_signalled())


def _check_port_free(port: int) -> None:
    """Fails early, as one line, when the metrics port is taken (the worker
    binds it like this, with SO_REUSEADDR, on all addresses)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as exc:
            raise CliError(f"--metrics-port {port}: {exc.strerror or exc}") from None


# -- serve --------------------------------------------------------------------

app.command("serve")(serve_command)  # runlane.cli_api, like `runlane keys ...`


# -- submit -------------------------------------------------------------------


@app.command()
def submit(
    agent: Annotated[str, typer.Argument(help="The agent to run.")],
    input: Annotated[
        str, typer.Option("--input", "-i", help="The run's input as JSON ('-' reads stdin).")
    ] = "{}",
    thread: Annotated[
        str | None,
        typer.Option(
            "--thread", "-t", help="Submit a request into this thread's lane instead of a run."
        ),
    ] = None,
    policy: Annotated[
        Policy | None,
        typer.Option(help="With --thread: what to do when the lane is busy (default enqueue)."),
    ] = None,
    request_id: Annotated[
        str | None,
        typer.Option(help="With --thread: idempotency key of the request (default: generated)."),
    ] = None,
    user: Annotated[
        str | None,
        typer.Option(
            help="With --thread: the lane's user (default: $RUNLANE_USER, else 'default')."
        ),
    ] = None,
    tenant: Annotated[
        str | None, typer.Option(help="Default: $RUNLANE_TENANT, else 'default'.")
    ] = None,
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    delay: Annotated[float, typer.Option(help="Seconds before it may start.")] = 0.0,
    max_attempts: Annotated[int | None, typer.Option(help="Default: RUNLANE_MAX_ATTEMPTS.")] = None,
    max_seconds: Annotated[float | None, typer.Option(help="Deadline budget in seconds.")] = None,
    idempotency_key: Annotated[
        str | None, typer.Option(help="The same key returns the run it first created.")
    ] = None,
    wait: Annotated[
        bool,
        typer.Option("--wait", help="Follow the run (or the request, then its run) to its end."),
    ] = False,
    timeout: Annotated[
        float | None, typer.Option(help="With --wait: give up after this many seconds.")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print JSON lines: the run (or request), then (with --wait) each change,"
            " each event and the ended run.",
        ),
    ] = False,
) -> None:
    """Submit a run and print its id; with --thread, submit a request into the
    thread's lane and print the request id and where it stands.

    A rejected request (--policy reject on a busy lane) is a normal result:
    exit 0. With --wait, follow it to its end: exit 0 if the run completed, 3
    if it was interrupted (waiting for a human), 4 if the request was
    rejected, 1 if the run failed, died or was cancelled (or the request was
    cancelled).
    """
    payload = parse_json_option(input, "--input")
    budget = {"max_seconds": max_seconds} if max_seconds is not None else None
    if thread is not None:
        if delay:
            raise CliError("--delay is for direct runs; a request waits for its lane")
        if idempotency_key is not None:
            raise CliError("--idempotency-key is for direct runs; use --request-id with --thread")
        code = submit_to_thread(
            agent=agent,
            thread=thread,
            payload=payload,
            policy=policy or Policy.ENQUEUE,
            request_id=request_id,
            user=user,
            tenant=tenant,
            priority=priority,
            max_attempts=max_attempts,
            budget=budget,
            wait=wait,
            timeout=timeout,
            as_json=as_json,
        )
        if code:
            raise typer.Exit(code)
        return
    for name, value in (("--policy", policy), ("--request-id", request_id), ("--user", user)):
        if value is not None:
            raise CliError(f"{name} needs --thread (it applies to requests in a thread's lane)")

    async def go(service: RunService) -> int:
        run, created = await service.submit(
            agent,
            payload,
            tenant=tenant_of(tenant),
            priority=priority,
            delay_seconds=delay,
            max_attempts=max_attempts,
            budget=budget,
            idempotency_key=idempotency_key,
        )
        if as_json:
            print_json_line({"type": "run", "created": created, **record(run)})
        else:
            console.print(Text(str(run.id)))
            if not created:
                err_console.print(Text(f"(existing run for this idempotency key: {run.status})"))
        if not wait:
            return 0
        try:
            async with asyncio.timeout(timeout):
                return await follow_run(service, run, as_json=as_json)
        except TimeoutError:
            current = await service.get(run.id)
            raise CliError(
                f"timed out after {timeout:g}s; run {run.id} is still {current.status}"
            ) from None

    code = with_service(go)
    if code:
        raise typer.Exit(code)


# -- db -----------------------------------------------------------------------


@db_app.command("url")
def db_url() -> None:
    """Print the database URL (starting the embedded server if needed)."""
    settings = load_settings()
    console.print(Text(resolve_database_url(settings, apply_migrations=False)))


@db_app.command("start")
def db_start() -> None:
    """Start the embedded server (if not running) and migrate its schema."""
    settings = load_settings()
    _refuse_external(settings.database_url)
    url = resolve_database_url(settings)
    console.print(Text(f"embedded PostgreSQL is running: {url}"))


@db_app.command("stop")
def db_stop() -> None:
    """Stop the embedded server."""
    settings = load_settings()
    _refuse_external(settings.database_url)
    if embedded_server(settings).stop():
        console.print("embedded PostgreSQL stopped")
    else:
        console.print("embedded PostgreSQL was not running")


def _refuse_external(database_url: str | None) -> None:
    if database_url:
        raise CliError("RUNLANE_DATABASE_URL is set; runlane does not manage that server")


# -- demo ---------------------------------------------------------------------


@app.command()
def demo(
    once: Annotated[
        bool,
        typer.Option("--once", help="Exit when the script is done: 0 if all ended as scripted."),
    ] = False,
    host: Annotated[str, typer.Option(help="The HTTP API's address.")] = DEFAULT_HOST,
    port: Annotated[
        int,
        typer.Option(min=0, max=65535, help="The HTTP API's port (a free one if it is taken)."),
    ] = DEFAULT_PORT,
) -> None:
    """Run the built-in demo: a worker, the HTTP API with a demo key, a few
    runs and live progress."""
    from runlane.demo import run_demo

    code = run_demo(load_settings(), once=once, host=host, port=port)
    if code:
        raise typer.Exit(code)


def main() -> None:
    """The ``runlane`` console script."""
    try:
        # Not standalone: usage errors come here too and print as one line.
        result = app(prog_name="runlane", standalone_mode=False)
    except Exception as exc:
        if os.environ.get("RUNLANE_DEBUG"):
            raise
        sys.exit(report_error(exc))
    sys.exit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    main()
