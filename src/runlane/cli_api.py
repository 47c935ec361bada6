"""``runlane serve`` (the HTTP API under uvicorn) and ``runlane keys ...``
(its bearer API keys), plus the server plumbing the demo shares.

A key is printed once, when it is created; only its sha256 is stored, so
``keys list`` shows its public prefix, never the secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import socket
from collections.abc import Iterator
from typing import Annotated, Any

import typer
import uvicorn
from rich import box
from rich.table import Table
from rich.text import Text
from starlette.types import ASGIApp

from runlane.cli_runs import (
    CliError,
    JsonFlag,
    LogLevel,
    configure_logging,
    console,
    err_console,
    format_time,
    load_app,
    load_settings,
    print_json,
    print_json_line,
    with_key_store,
)
from runlane.database import resolve_database_url
from runlane.keys import KEY_PREFIX, ApiKey, KeyStore

logger = logging.getLogger("runlane.serve")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# On shutdown, open event streams get this long before they are cut (clients
# reconnect with Last-Event-ID).
GRACEFUL_SHUTDOWN_SECONDS = 5
# "rl_" and 8 hex characters: the public part of a key, shown in listings.
_FULL_KEY = re.compile(rf"^({re.escape(KEY_PREFIX)}[0-9a-f]{{8}})_.+$")

keys_app = typer.Typer(help="Create, list and revoke the HTTP API's keys.", no_args_is_help=True)


# -- the server ---------------------------------------------------------------


class ApiServer(uvicorn.Server):
    """uvicorn's server without its own signal handling: whoever runs it
    sets ``should_exit`` (uvicorn would re-raise the signal after a graceful
    shutdown, turning a clean SIGTERM into a killed process). On shutdown it
    disconnects open event streams instead of waiting for them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # no new connections (uvicorn closes them again)
        closed = self.disconnect_event_streams()
        if closed:
            logger.info("closed %d open event stream(s); clients resume with Last-Event-ID", closed)
        await super().shutdown(sockets=sockets)

    def disconnect_event_streams(self) -> int:
        """Closes the connections of open event streams. The app sees its
        client go (``http.disconnect``) and ends each stream cleanly, rather
        than holding the shutdown until the graceful timeout cancels it
        (logged as an error). A run never depends on its subscribers."""
        closed = 0
        for connection in list(self.server_state.connections):
            # uvicorn's protocols keep the current request cycle and transport.
            cycle = getattr(connection, "cycle", None)
            if cycle is None or getattr(cycle, "response_complete", True):
                continue
            path = str((getattr(cycle, "scope", None) or {}).get("path", ""))
            transport = getattr(connection, "transport", None)
            if path.endswith("/events") and transport is not None:
                transport.close()
                closed += 1
        return closed


def listen_socket(host: str, port: int, *, any_port_if_taken: bool = False) -> socket.socket:
    """A socket bound to ``host:port`` for uvicorn to listen on. When the
    port is taken: a free port if ``any_port_if_taken``, else a CliError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        try:
            sock.bind((host, port))
        except OSError:
            if not any_port_if_taken or port == 0:
                raise
            sock.bind((host, 0))
    except OSError as exc:
        sock.close()
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    elif host == "0.0.0.0":
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def api_server(asgi_app: ASGIApp, *, log_level: str, quiet: bool = False) -> ApiServer:
    """A server for ``asgi_app`` (serve it with ``server.serve(sockets=[...])``).
    ``quiet``: no access log and no logging configuration of uvicorn's own."""
    extra: dict[str, Any] = {"log_config": None, "access_log": False} if quiet else {}
    config = uvicorn.Config(
        asgi_app,
        log_level=log_level.lower(),
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        **extra,
    )
    return ApiServer(config)


async def wait_started(server: ApiServer, task: asyncio.Task[None]) -> bool:
    """Waits until the server accepts connections (True) or its task ended
    without starting (False)."""
    while not server.started:
        if task.done():
            return False
        await asyncio.sleep(0.02)
    return True


async def _serve_until_signalled(server: ApiServer, sock: socket.socket, agents: str) -> bool:
    loop = asyncio.get_running_loop()
    signals: list[int] = []

    def on_signal(sig: int) -> None:
        signals.append(sig)
        if server.should_exit and sig == signal.SIGINT:
            server.force_exit = True  # a second Ctrl-C: do not wait for streams
        server.should_exit = True

    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    try:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        url = base_url(sock)
        if await wait_started(server, task):
            logger.info("HTTP API on %s (OpenAPI docs: %s/docs); agents: %s", url, url, agents)
        await task
        if signals:
            logger.info("signal received; the API stopped")
        return server.started
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def serve(
    host: Annotated[str, typer.Option(help="The address to listen on.")] = DEFAULT_HOST,
    port: Annotated[int, typer.Option(min=0, max=65535, help="The TCP port.")] = DEFAULT_PORT,
    target: Annotated[
        str | None,
        typer.Option(
            "--app",
            metavar="MODULE:APP",
            help="An App whose agents are the only ones accepted (others: 422 unknown_agent).",
        ),
    ] = None,
    log_level: Annotated[LogLevel, typer.Option(case_sensitive=False)] = LogLevel.INFO,
) -> None:
    """Serve the HTTP API (uvicorn) until SIGTERM or SIGINT.

    Without --app any agent name is accepted and a run of an agent no worker
    has fails there (unknown_agent). Create keys with `runlane keys create`.
    """
    from runlane.api import create_app  # not imported by every other command

    configure_logging(log_level)
    agents: frozenset[str] | None = None
    if target is not None:
        runlane_app = load_app(target)
        settings = runlane_app.settings
        agents = frozenset(runlane_app.agents)
    else:
        settings = load_settings()
    url = resolve_database_url(settings)
    sock = listen_socket(host, port)
    server = api_server(create_app(settings, url, agents=agents), log_level=log_level.value)
    described = ", ".join(sorted(agents)) if agents is not None else "any"
    try:
        started = asyncio.run(_serve_until_signalled(server, sock, described or "(none)"))
    finally:
        sock.close()
    if not started:
        raise CliError("the HTTP API did not start (see the log above)")


# -- keys ---------------------------------------------------------------------


def key_record(key: ApiKey) -> dict[str, Any]:
    """A JSON-ready dict of a key: never its secret nor its hash."""
    return {
        "id": str(key.id),
        "prefix": key.prefix,
        "tenant": key.tenant,
        "user_id": key.user_id,
        "admin": key.admin,
        "name": key.name,
        "created_at": key.created_at.isoformat(),
        "last_used_at": key.last_used_at.isoformat() if key.last_used_at else None,
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }


def _scope(key: ApiKey) -> str:
    return f"tenant {key.tenant}, user {key.user_id}" + (", admin" if key.admin else "")


@keys_app.command("create")
def create_key(
    tenant: Annotated[str, typer.Option(help="The tenant the key acts in.")],
    user: Annotated[str, typer.Option(help="The user the key acts for.")],
    admin: Annotated[
        bool,
        typer.Option(
            "--admin", help="See every user's runs and requests of the tenant; retry runs."
        ),
    ] = False,
    name: Annotated[
        str | None, typer.Option(help="A label for listings (e.g. what uses the key).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the key and its metadata as one JSON line.")
    ] = False,
) -> None:
    """Create an API key and print it. It is shown only this once: only its
    hash is stored."""
    if name is not None and not 1 <= len(name) <= 200:
        raise CliError("--name must be 1-200 characters")

    async def go(keys: KeyStore) -> tuple[ApiKey, str]:
        return await keys.create(tenant=tenant, user_id=user, admin=admin, name=name)

    key, secret = with_key_store(go)
    if as_json:
        print_json_line({"key": secret, **key_record(key)})
        return
    console.print(Text(secret))
    err_console.print(
        Text(
            f"created key {key.prefix} ({_scope(key)}); it is shown only once: store it now",
            style="dim",
        )
    )


@keys_app.command("list")
def list_keys(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """List API keys (their public prefixes, never the secrets), oldest first."""

    async def go(keys: KeyStore) -> list[ApiKey]:
        return await keys.list(tenant=tenant)

    found = with_key_store(go)
    if as_json:
        print_json([key_record(key) for key in found])
        return
    if not found:
        console.print("no keys")
        return
    table = Table(box=box.SIMPLE_HEAD)
    table.add_column("prefix", no_wrap=True)
    for column in ("tenant", "user", "admin", "name", "created", "last used", "revoked"):
        table.add_column(column)
    for key in found:
        table.add_row(
            key.prefix,
            Text(key.tenant),
            Text(key.user_id),
            "yes" if key.admin else "",
            Text(key.name or ""),
            format_time(key.created_at),
            format_time(key.last_used_at),
            Text(format_time(key.revoked_at), style="red" if key.revoked_at else ""),
        )
    console.print(table)


@keys_app.command("revoke")
def revoke_key(
    prefix: Annotated[
        str, typer.Argument(metavar="PREFIX", help="The key's prefix (rl_xxxxxxxx) or the key.")
    ],
    as_json: JsonFlag = False,
) -> None:
    """Revoke an API key: from now on it gets 401. Revoking again is harmless."""
    whole = _FULL_KEY.match(prefix)
    wanted = whole.group(1) if whole else prefix

    async def go(keys: KeyStore) -> ApiKey:
        return await keys.revoke(wanted)

    key = with_key_store(go)
    if as_json:
        print_json(key_record(key))
        return
    console.print(
        Text(f"revoked key {key.prefix} ({_scope(key)}) at {format_time(key.revoked_at)}")
    )
