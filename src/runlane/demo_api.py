"""The demo's HTTP API: uvicorn in the demo's process next to its worker, a
demo API key (tenant ``demo``, user ``demo``), the curl commands to try it,
and the script's own request submitted and followed over HTTP.

The HTTP client is the standard library's (no proxies: the API is local).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool
from rich.console import Console

from runlane.api import create_app
from runlane.cli_api import (
    GRACEFUL_SHUTDOWN_SECONDS,
    ApiServer,
    api_server,
    base_url,
    listen_socket,
    wait_started,
)
from runlane.errors import RunlaneError
from runlane.keys import KeyStore
from runlane.settings import Settings

TENANT = "demo"
USER = "demo"
# The thread the printed curl submits into.
CURL_THREAD = "demo-1"
START_TIMEOUT_SECONDS = 30.0
HTTP_TIMEOUT_SECONDS = 15.0

_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class DemoApiError(RunlaneError):
    """The demo's API did not start or did not answer as it should."""

    code = "demo_api"


@dataclass
class DemoApi:
    url: str
    key: str
    prefix: str
    server: ApiServer
    task: asyncio.Task[None]
    keys: KeyStore

    async def stop(self) -> None:
        """Revokes the demo key and stops the server (open event streams
        get a few seconds, then they are cut)."""
        try:
            await self.keys.revoke(self.prefix)
        finally:
            self.server.should_exit = True
            await asyncio.wait_for(self.task, GRACEFUL_SHUTDOWN_SECONDS + 10)


async def start_api(
    url: str,
    settings: Settings,
    pool: AsyncConnectionPool[AsyncConnection[DictRow]],
    agents: frozenset[str],
    *,
    host: str,
    port: int,
) -> DemoApi:
    """Serves the API on ``host:port`` (a free port if that one is taken)
    and creates the demo key."""
    sock = listen_socket(host, port, any_port_if_taken=True)
    server = api_server(create_app(settings, url, agents=agents), log_level="warning", quiet=True)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="runlane-demo-api")
    try:
        async with asyncio.timeout(START_TIMEOUT_SECONDS):
            started = await wait_started(server, task)
    except TimeoutError:
        started = False
    if not started:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
        sock.close()
        raise DemoApiError(f"the HTTP API did not start on {base_url(sock)}")
    keys = KeyStore(pool)
    try:
        key, secret = await keys.create(tenant=TENANT, user_id=USER, name="runlane demo")
    except BaseException:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
        raise
    return DemoApi(base_url(sock), secret, key.prefix, server, task, keys)


def print_instructions(console: Console, api: DemoApi) -> None:
    """The URL, the key, and curl commands ready to paste into a shell."""
    auth = '-H "Authorization: Bearer $KEY"'
    body = json.dumps({"agent": "demo", "input": {"text": "hi there"}}, separators=(",", ":"))
    submit = (
        f"curl -s {auth} -H 'content-type: application/json' -d '{body}' "
        f"{api.url}/v1/threads/{CURL_THREAD}/requests"
    )
    run_id = "python3 -c 'import json,sys; print(json.load(sys.stdin)[\"run_id\"])'"
    lines = [
        f"HTTP API on {api.url}  (OpenAPI docs: {api.url}/docs)",
        f"Dashboard: {api.url}/ui/  (chat; operations at {api.url}/ui/ops.html; paste the key)",
        f"demo API key (tenant {TENANT!r}, user {USER!r}; revoked when the demo stops): {api.key}",
        f"Submit a request into thread {CURL_THREAD} and follow its run's events:",
        f"  export KEY={api.key}",
        f"  RUN=$({submit} | {run_id})",
        f"  curl -sN {auth} {api.url}/v1/runs/$RUN/events",
    ]
    for line in lines:
        console.print(line, soft_wrap=True, markup=False, highlight=False, emoji=False)


# -- a small HTTP client ------------------------------------------------------


def _request(method: str, url: str, *, key: str | None, body: Any = None) -> urllib.request.Request:
    headers = {"Accept": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    return urllib.request.Request(url, data=data, method=method, headers=headers)


def _call(method: str, url: str, key: str | None, body: Any) -> tuple[int, Any]:
    try:
        with _opener.open(
            _request(method, url, key=key, body=body), timeout=HTTP_TIMEOUT_SECONDS
        ) as r:
            status, raw = int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


async def http_json(
    method: str, url: str, *, key: str | None = None, body: Any = None
) -> tuple[int, Any]:
    """The status and JSON body of one HTTP call (in a thread)."""
    try:
        return await asyncio.to_thread(_call, method, url, key, body)
    except (OSError, urllib.error.URLError) as exc:
        raise DemoApiError(f"{method} {url} failed: {exc}") from None


def _sse_events(lines: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    """Server-sent events as ``{"id", "event", "data"}``; comments skipped."""
    fields: dict[str, Any] = {}
    for raw in lines:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if "data" in fields:
                fields["data"] = json.loads(fields["data"])
                yield fields
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


def _read_stream(url: str, key: str) -> list[dict[str, Any]]:
    """The events of a run's stream, up to and including ``end``."""
    request = _request("GET", url, key=key)
    request.add_header("Accept", "text/event-stream")
    received = []
    with _opener.open(request, timeout=HTTP_TIMEOUT_SECONDS) as response:
        for event in _sse_events(iter(response.readline, b"")):
            received.append(event)
            if event.get("event") == "end":
                break
    return received


# -- what the script does over HTTP -------------------------------------------


async def submit_over_http(api: DemoApi, *, thread: str, input: Any, metadata: Any) -> UUID:
    """Checks /healthz, then submits a request with the demo key into an
    idle thread; returns the id of the run it was dispatched as."""
    status, health = await http_json("GET", f"{api.url}/healthz")
    if status != 200 or health != {"status": "ok"}:
        raise DemoApiError(f"GET /healthz answered {status}: {health}")
    path = f"/v1/threads/{thread}/requests"
    status, body = await http_json(
        "POST",
        api.url + path,
        key=api.key,
        body={"agent": "demo", "input": input, "metadata": metadata},
    )
    if status != 201 or not isinstance(body, dict) or body.get("status") != "dispatched":
        raise DemoApiError(f"POST {path} answered {status}: {body}")
    return UUID(str(body["run_id"]))


async def check_run_over_http(api: DemoApi, run_id: UUID) -> str | None:
    """Reads the run and replays its event stream over HTTP; returns what
    is wrong, or None when it completed and every event arrived in order."""
    status, run = await http_json("GET", f"{api.url}/v1/runs/{run_id}", key=api.key)
    if status != 200 or not isinstance(run, dict):
        return f"GET /v1/runs/{run_id} answered {status}: {run}"
    if run.get("status") != "completed":
        return f"the run submitted over HTTP ended {run.get('status')}"
    url = f"{api.url}/v1/runs/{run_id}/events"
    try:
        received = await asyncio.to_thread(_read_stream, url, api.key)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return f"GET /v1/runs/{run_id}/events failed: {exc}"
    ids = [int(e["id"]) for e in received if "id" in e]
    if ids != list(range(1, int(run["last_event_seq"]) + 1)):
        return f"the event stream gave ids {ids}; the run has {run['last_event_seq']} events"
    end = received[-1] if received else {}
    if end.get("event") != "end" or end["data"].get("status") != "completed":
        return f"the event stream did not end with the run's status: {end}"
    return None
