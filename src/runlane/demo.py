"""The built-in demo: a scripted streaming "model" and a live view of its runs.

``app`` serves one agent, ``demo`` (:func:`runlane.demo_agent.demo_agent`):
a fake streaming chat model driven by its input. The simplest input::

    {"text": str, "turns": int = 3, "token_delay": float = 0.05,
     "fail_on_attempt": int | None = None, "retry_delay": float | None = None}

Each turn it stops at a safe point, streams ``text`` word by word as
``token`` events and saves the checkpoint ``{"turn": n, ...}``; a later
attempt resumes after the last saved turn. On the attempt numbered
``fail_on_attempt`` it fails after one turn: with ``retry_delay`` it raises
:class:`runlane.Retry` (retried after that many seconds), without it a
``RuntimeError`` (retried with the default backoff, about 5 s after the
first attempt). Tools, approval through an interrupt and failures at a
given turn: see :mod:`runlane.demo_agent`.

:func:`run_demo` starts a worker and the HTTP API in this process, creates
a demo API key and prints curl commands to try it, submits a few runs (a
normal one, a longer one, one cancelled while it streams, one that fails
once and is retried, and a request submitted over HTTP with the demo key)
and shows them live in the terminal (a line per change when the output is
not a terminal).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import psycopg
from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

import runlane
from runlane.cli_api import DEFAULT_HOST, DEFAULT_PORT
from runlane.cli_runs import CliError
from runlane.database import resolve_database_url
from runlane.demo_agent import AGENT, demo_agent
from runlane.demo_api import (
    DemoApi,
    check_run_over_http,
    print_instructions,
    start_api,
    submit_over_http,
)
from runlane.errors import RunlaneError
from runlane.models import Run, RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from runlane.worker import Worker

app = runlane.App()
app.agent(AGENT)(demo_agent)


# -- the script ---------------------------------------------------------------


@dataclass(slots=True)
class Tracked:
    """A run the demo shows."""

    label: str
    run: Run
    # The end the script expects (None: a run submitted from elsewhere).
    expected: RunStatus | None = None
    expected_attempts: int | None = None
    # Cancel the run once it has streamed this many tokens.
    cancel_after_tokens: int | None = None
    cancel_sent: bool = False
    tokens: int = 0
    tail: str = ""
    last_seq: int = 0
    shown: tuple[str, int] | None = None
    problem: str | None = None

    @property
    def short_id(self) -> str:
        return str(self.run.id)[:8]

    @property
    def scripted(self) -> bool:
        return self.expected is not None

    @property
    def ended_as_scripted(self) -> bool:
        return (
            self.run.status is self.expected
            and (self.expected_attempts is None or self.run.attempts == self.expected_attempts)
            and self.problem is None
        )


@dataclass(frozen=True, slots=True)
class Script:
    label: str
    input: dict[str, Any]
    expected: RunStatus
    expected_attempts: int | None = None
    cancel_after_tokens: int | None = None
    priority: int = 0


SCRIPT = (
    Script(
        "greeting",
        {"text": "Hello! I am a scripted model, streaming one word at a time.", "turns": 3},
        RunStatus.COMPLETED,
        expected_attempts=1,
        priority=1,
    ),
    Script(
        "essay",
        {
            "text": "Runs live in PostgreSQL: leased, heartbeated, fenced and recoverable.",
            "turns": 4,
        },
        RunStatus.COMPLETED,
        expected_attempts=1,
    ),
    Script(
        "cancel-me",
        {"text": "This run is long and will be cancelled while it streams.", "turns": 50},
        RunStatus.CANCELLED,
        cancel_after_tokens=6,
    ),
    Script(
        "flaky",
        {
            "text": "I fail once, then resume from my checkpoint.",
            "turns": 3,
            "fail_on_attempt": 1,
            "retry_delay": 1.0,
        },
        RunStatus.COMPLETED,
        expected_attempts=2,
    ),
)


# The script's request submitted over HTTP with the demo key, into a thread
# of its own (so its lane is idle and it is dispatched at once).
API_SCRIPT = Script(
    "api",
    {"text": "Hello over HTTP: a request submitted with the demo API key.", "turns": 2},
    RunStatus.COMPLETED,
    expected_attempts=1,
)


@dataclass
class DemoView:
    """What the demo shows, and its verdict."""

    console: Console
    tracked: dict[UUID, Tracked] = field(default_factory=dict)
    # Without --once, runs created after this are shown too.
    since: datetime | None = None

    def log_changes(self) -> None:
        """One line per status or attempt change (for non-terminal output)."""
        for item in self.tracked.values():
            state = (str(item.run.status), item.run.attempts)
            if state == item.shown:
                continue
            item.shown = state
            line = Text.assemble(
                (f"{item.short_id} ", "dim"),
                (f"{item.label:<10} ", "bold"),
                (f"{item.run.status:<16}", _STATUS_STYLE.get(item.run.status, "")),
                f" attempt {item.run.attempts}/{item.run.max_attempts}",
            )
            note = _note(item)
            if note:
                line.append(f"  {note}", style="dim")
            self.console.print(line, soft_wrap=True)

    def table(self) -> Table:
        table = Table(title="runlane demo", box=box.SIMPLE_HEAD)
        table.add_column("run", style="dim", no_wrap=True, min_width=8)
        table.add_column("label", style="bold", no_wrap=True, min_width=9)
        table.add_column("status", no_wrap=True, min_width=16)
        table.add_column("attempt", justify="right", no_wrap=True, min_width=7)
        table.add_column("tokens", justify="right", no_wrap=True, min_width=6)
        table.add_column("last tokens", no_wrap=True, overflow="ellipsis", max_width=34)
        table.add_column("note", style="dim", no_wrap=True, overflow="ellipsis", max_width=36)
        for item in list(self.tracked.values())[-20:]:
            table.add_row(
                item.short_id,
                item.label,
                Text(str(item.run.status), style=_STATUS_STYLE.get(item.run.status, "")),
                f"{item.run.attempts}/{item.run.max_attempts}",
                str(item.tokens),
                item.tail,
                _note(item),
            )
        return table


_STATUS_STYLE = {
    RunStatus.PENDING: "yellow",
    RunStatus.RUNNING: "cyan",
    RunStatus.CANCEL_REQUESTED: "magenta",
    RunStatus.COMPLETED: "green",
    RunStatus.CANCELLED: "magenta",
    RunStatus.FAILED: "red",
    RunStatus.DEAD: "red",
}


def _note(item: Tracked) -> str:
    run = item.run
    if item.problem:
        return item.problem
    if run.status is RunStatus.PENDING and run.error:
        return f"retrying: {run.error.get('message', run.error.get('code', ''))}"
    if run.status is RunStatus.COMPLETED and isinstance(run.output, dict):
        resumed = run.output.get("resumed_from_turn")
        if resumed:
            return f"resumed from checkpoint turn {resumed}"
        return "done"
    if run.status in (RunStatus.FAILED, RunStatus.DEAD) and run.error:
        return str(run.error.get("message") or run.error.get("code", ""))
    if run.status is RunStatus.CANCEL_REQUESTED:
        return "cancel requested"
    if run.status is RunStatus.CANCELLED:
        return "cancelled by the script" if item.cancel_sent else "cancelled"
    return ""


async def _refresh(view: DemoView, service: RunService) -> None:
    """Reads the shown runs and their new token events."""
    store = service.store
    if view.since is not None:
        for run in await store.list_runs(limit=50):
            if run.id not in view.tracked and run.created_at > view.since:
                view.tracked[run.id] = Tracked(label=run.agent, run=run)
        # Newest last, like the scripted ones.
        view.tracked = dict(sorted(view.tracked.items(), key=lambda kv: kv[1].run.created_at))
    for item in view.tracked.values():
        if item.run.status.is_terminal and item.last_seq >= item.run.last_event_seq:
            continue  # nothing more will change
        fresh = await store.get_run(item.run.id)
        if fresh is not None:
            item.run = fresh
        for event in await store.list_events(item.run.id, after_seq=item.last_seq):
            item.last_seq = event.seq
            if event.kind == "token" and isinstance(event.data, dict):
                item.tokens += 1
                item.tail = (item.tail + str(event.data.get("text", "")))[-32:]


async def _drive(view: DemoView, service: RunService) -> None:
    """Sends the scripted cancels and notes runs that went wrong."""
    for item in view.tracked.values():
        if (
            item.cancel_after_tokens is not None
            and not item.cancel_sent
            and item.tokens >= item.cancel_after_tokens
        ):
            item.cancel_sent = True
            try:
                item.run = await service.cancel(item.run.id)
            except RunlaneError as exc:
                item.problem = f"cancel refused: {exc}"
        if item.scripted and item.run.status.is_terminal and not item.ended_as_scripted:
            item.problem = item.problem or (
                f"ended {item.run.status} after {item.run.attempts} attempt(s); "
                f"expected {item.expected}"
                + (f" after {item.expected_attempts}" if item.expected_attempts else "")
            )


def _scripted_done(view: DemoView) -> bool:
    return all(item.run.status.is_terminal for item in view.tracked.values() if item.scripted)


@contextlib.contextmanager
def _signals(stop: asyncio.Event) -> Iterator[None]:
    """Ctrl-C and SIGTERM set ``stop`` (where the platform allows)."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):
            continue
        installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def _demo(
    url: str,
    settings: Settings,
    *,
    once: bool,
    timeout_seconds: float,
    console: Console,
    host: str,
    port: int,
) -> int:
    worker = Worker(app, url, concurrency=4, settings=settings, agents=list(app.agents))
    stop = asyncio.Event()
    await worker.start()
    api: DemoApi | None = None
    try:
        api = await start_api(
            url, settings, worker.store.pool, frozenset(app.agents), host=host, port=port
        )
        print_instructions(console, api)
        with _signals(stop):
            service = RunService(worker.store, settings)
            view = DemoView(console)
            for script in SCRIPT:
                run, _ = await service.submit(
                    AGENT,
                    script.input,
                    priority=script.priority,
                    max_attempts=max(settings.max_attempts, 2),
                    metadata={"demo": script.label},
                )
                _track(view, script, run)
            api_run_id = await submit_over_http(
                api,
                thread=f"demo-{uuid4().hex[:8]}",
                input=API_SCRIPT.input,
                metadata={"demo": API_SCRIPT.label},
            )
            _track(view, API_SCRIPT, await service.get(api_run_id))
            console.print(
                f"worker {worker.worker_id} serving agent {AGENT!r}; "
                f"submitted {len(view.tracked)} runs ({API_SCRIPT.label!r} over HTTP)",
                soft_wrap=True,
            )
            live_output = console.is_terminal
            code = await _watch(
                view,
                service,
                stop,
                once=once,
                timeout_seconds=timeout_seconds,
                console=console,
                live_output=live_output,
            )
            if code == 0 and once:
                problem = await check_run_over_http(api, api_run_id)
                if problem:
                    _error(console, problem)
                    return 1
                console.print(
                    "[green]HTTP API check passed: /healthz, a request submitted with the demo"
                    " key, and its run's event stream replayed to the end[/green]",
                    soft_wrap=True,
                )
            return code
    finally:
        if api is not None:
            console.print("stopping the HTTP API (the demo key is revoked)...")
            await api.stop()
        console.print("stopping the worker...")
        await worker.stop()


def _track(view: DemoView, script: Script, run: Run) -> None:
    view.tracked[run.id] = Tracked(
        label=script.label,
        run=run,
        expected=script.expected,
        expected_attempts=script.expected_attempts,
        cancel_after_tokens=script.cancel_after_tokens,
    )


async def _watch(
    view: DemoView,
    service: RunService,
    stop: asyncio.Event,
    *,
    once: bool,
    timeout_seconds: float,
    console: Console,
    live_output: bool,
) -> int:
    started = time.monotonic()
    announced = False
    live: Live | None = None
    if live_output:
        live = Live(view.table(), console=console, refresh_per_second=8)
        live.start()
    try:
        while True:
            await _refresh(view, service)
            await _drive(view, service)
            if live is not None:
                live.update(view.table())
            else:
                view.log_changes()
            if _scripted_done(view):
                if once:
                    break
                if not announced:
                    announced = True
                    # From now on, show runs submitted from elsewhere too.
                    view.since = min(i.run.created_at for i in view.tracked.values())
                    console.print(
                        "scripted runs done; the worker and the HTTP API keep serving agent"
                        " 'demo'. Try the curl commands above, or: "
                        'runlane submit demo --input \'{"text": "hi there"}\' --wait  '
                        "(Ctrl-C stops)",
                        soft_wrap=True,
                        markup=False,
                    )
            elif once and time.monotonic() - started > timeout_seconds:
                _final_table(console, view, live)
                live = None
                late = [i.label for i in view.tracked.values() if not i.run.status.is_terminal]
                _error(
                    console,
                    f"demo timed out after {timeout_seconds:g}s; not finished: {', '.join(late)}",
                )
                return 1
            if stop.is_set():
                _final_table(console, view, live)
                live = None
                if once:
                    console.print("interrupted before the script was done")
                    return 130
                console.print("stopped")
                return 0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.2)
    finally:
        if live is not None:
            live.stop()
    if not live_output:
        _final_table(console, view, None)
    wrong = [i for i in view.tracked.values() if i.scripted and not i.ended_as_scripted]
    if wrong:
        for item in wrong:
            _error(console, f"{item.label} ({item.run.id}): {item.problem}")
        return 1
    console.print(f"[green]demo finished: all {len(view.tracked)} runs ended as scripted[/green]")
    return 0


def _final_table(console: Console, view: DemoView, live: Live | None) -> None:
    """Leaves the final table on screen: a live one stays where it is;
    otherwise it is printed at least 132 columns wide (a log), so that no
    column is squeezed out."""
    if live is not None:
        live.update(view.table())
        live.stop()
        return
    if console.is_terminal or console.width >= 132:
        console.print(view.table())
        return
    saved = console.width
    console.width = 132
    try:
        console.print(view.table())
    finally:
        console.width = saved


def run_demo(
    settings: Settings,
    *,
    once: bool,
    timeout_seconds: float = 60.0,
    console: Console | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
) -> int:
    """Runs the demo; returns a process exit code.

    The HTTP API listens on ``host:port``, or on a free port if that one is
    taken. With ``once`` it returns 0 when every scripted run ended as
    expected (the one submitted over HTTP included) and the API served that
    run's event stream; 1 when a run ended otherwise, ``timeout_seconds``
    passed or the API misbehaved. Without it the worker and the API keep
    serving (and showing) runs until Ctrl-C or SIGTERM.
    """
    console = console or Console()
    try:
        return _run_demo(
            settings,
            once=once,
            timeout_seconds=timeout_seconds,
            console=console,
            host=host,
            port=port,
        )
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130


def _run_demo(
    settings: Settings,
    *,
    once: bool,
    timeout_seconds: float,
    console: Console,
    host: str,
    port: int,
) -> int:
    if not settings.database_url:
        console.print(
            f"starting the embedded PostgreSQL in {settings.data_dir / 'pgdata'} "
            "(RUNLANE_DATABASE_URL is unset)...",
            soft_wrap=True,
            markup=False,
        )
    try:
        url = resolve_database_url(settings)
    except (RunlaneError, psycopg.Error, OSError, subprocess.CalledProcessError) as exc:
        _error(console, f"cannot start or reach the database: {exc}")
        return 2
    where = "the external database" if settings.database_url else f"embedded PostgreSQL {url}"
    console.print(f"runlane demo on {where}", soft_wrap=True, markup=False)
    try:
        code = asyncio.run(
            _demo(
                url,
                settings,
                once=once,
                timeout_seconds=timeout_seconds,
                console=console,
                host=host,
                port=port,
            )
        )
    except (RunlaneError, psycopg.Error) as exc:
        _error(console, str(exc))
        return 1
    except CliError as exc:
        _error(console, exc.message)
        return 1
    if not settings.database_url:
        console.print("the embedded server keeps running; `runlane db stop` stops it")
    return code


def _error(console: Console, message: str) -> None:
    console.print(Text(" ".join(f"error: {message}".split()), style="red"), soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runlane.demo", description="runlane's built-in demo"
    )
    parser.add_argument(
        "--once", action="store_true", help="exit when the scripted runs have ended"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds, with --once")
    parser.add_argument("--host", default=DEFAULT_HOST, help="the HTTP API's address")
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help="the HTTP API's port (a free one if it is taken)",
    )
    args = parser.parse_args(argv)
    return run_demo(
        Settings(), once=args.once, timeout_seconds=args.timeout, host=args.host, port=args.port
    )


if __name__ == "__main__":
    sys.exit(main())
