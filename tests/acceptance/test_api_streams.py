"""Server-sent event streams over a real HTTP server: resume with
Last-Event-ID, fan-out from one LISTEN connection, request progress."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest

from runlane import App, RunContext, event_hub
from runlane.keys import KeyStore
from runlane.models import RunStatus
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import RunStore
from tests.api_support import ApiServer, create_key, serve_api
from tests.support import running_worker, wait_until


@dataclass
class SseEvent:
    event: str
    data: Any
    id: str | None


async def read_events(response: httpx.Response) -> AsyncIterator[SseEvent | str]:
    """Parses an SSE body; yields events, and comment lines as strings."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line.startswith(":"):
            yield line
            continue
        if line == "":
            if "data" in fields:
                yield SseEvent(
                    fields.get("event", "message"), json.loads(fields["data"]), fields.get("id")
                )
            fields = {}
            continue
        name, _, value = line.partition(":")
        fields[name] = value.removeprefix(" ")


async def collect(
    client: httpx.AsyncClient, path: str, *, stop_after: int | None = None, **kwargs: Any
) -> list[SseEvent]:
    events: list[SseEvent] = []
    async with client.stream("GET", path, **kwargs) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for item in read_events(response):
            if isinstance(item, SseEvent):
                events.append(item)
                if item.event == "end" or (stop_after and len(events) >= stop_after):
                    break
    return events


def streaming_app(settings: Settings, gate: asyncio.Event, count: int = 20) -> App:
    app = App(settings)

    @app.agent("talker")
    async def talker(ctx: RunContext) -> Any:
        for i in range(count):
            if i == count // 2:
                await gate.wait()  # the test decides when the second half comes
            await ctx.emit("token", {"i": i})
        return {"said": count}

    return app


@pytest.fixture
async def key(store: RunStore) -> str:
    return await create_key(KeyStore(store.pool), "acme", "ann")


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[ApiServer]:
    async with serve_api(settings, keepalive_seconds=0.5) as server:
        yield server


async def test_reconnect_with_last_event_id_gets_every_later_event_once(
    api: ApiServer, key: str, service: RunService, settings: Settings
) -> None:
    gate = asyncio.Event()
    run, _ = await service.submit("talker", {}, user_id="ann", tenant="acme")
    async with running_worker(streaming_app(settings, gate), settings), api.client(key) as client:
        first = await collect(client, f"/v1/runs/{run.id}/events", stop_after=5)
        assert [e.data["data"]["i"] for e in first] == [0, 1, 2, 3, 4]
        # The subscriber went away mid-run; the run goes on regardless.
        gate.set()
        done = await wait_until(
            lambda: _status(service, run.id, RunStatus.COMPLETED), message="run completed"
        )
        assert done.output == {"said": 20}
        rest = await collect(
            client, f"/v1/runs/{run.id}/events", headers={"Last-Event-ID": first[-1].id or ""}
        )
    assert [e.data["data"]["i"] for e in rest[:-1]] == list(range(5, 20))
    assert [int(e.id or 0) for e in rest[:-1]] == list(range(6, 21))
    assert rest[-1].event == "end" and rest[-1].data["status"] == "completed"
    assert rest[-1].data["output"] == {"said": 20}


async def test_live_stream_then_end(
    api: ApiServer, key: str, service: RunService, settings: Settings
) -> None:
    gate = asyncio.Event()
    run, _ = await service.submit("talker", {}, user_id="ann", tenant="acme")
    async with running_worker(streaming_app(settings, gate), settings), api.client(key) as client:
        reader = asyncio.create_task(collect(client, f"/v1/runs/{run.id}/events"))
        await wait_until(lambda: _last_seq(service, run.id, 10), message="first half")
        gate.set()
        events = await asyncio.wait_for(reader, 30)
    assert [e.event for e in events] == ["token"] * 20 + ["end"]
    assert [e.data["data"]["i"] for e in events[:-1]] == list(range(20))


async def test_a_finished_run_replays_and_ends_at_once(
    api: ApiServer, key: str, service: RunService, settings: Settings
) -> None:
    gate = asyncio.Event()
    gate.set()
    run, _ = await service.submit("talker", {}, user_id="ann", tenant="acme")
    async with running_worker(streaming_app(settings, gate, count=3), settings):
        await wait_until(lambda: _status(service, run.id, RunStatus.COMPLETED), message="done")
    async with api.client(key) as client:
        events = await asyncio.wait_for(collect(client, f"/v1/runs/{run.id}/events"), 10)
        later = await asyncio.wait_for(
            collect(client, f"/v1/runs/{run.id}/events", params={"after_seq": 2}), 10
        )
    assert [e.event for e in events] == ["token", "token", "token", "end"]
    assert [e.event for e in later] == ["token", "end"] and later[0].id == "3"


async def test_an_idle_stream_sends_keep_alive_comments(
    api: ApiServer, key: str, service: RunService
) -> None:
    run, _ = await service.submit("nobody-serves-this", {}, user_id="ann", tenant="acme")
    comments = []
    async with (
        api.client(key) as client,
        client.stream("GET", f"/v1/runs/{run.id}/events") as response,
    ):
        async for item in read_events(response):
            if isinstance(item, str):
                comments.append(item)
                if len(comments) == 2:
                    break
    assert comments == [": keep-alive", ": keep-alive"]


async def test_two_hundred_subscribers_share_one_listening_connection(
    api: ApiServer, key: str, service: RunService, settings: Settings, sql: psycopg.Connection[Any]
) -> None:
    gate = asyncio.Event()
    run, _ = await service.submit("talker", {}, user_id="ann", tenant="acme")
    limits = httpx.Limits(max_connections=250, max_keepalive_connections=250)
    async with api.client(key, limits=limits) as client:
        readers = [
            asyncio.create_task(collect(client, f"/v1/runs/{run.id}/events")) for _ in range(200)
        ]
        await wait_until(
            lambda: api.context.hub.subscriber_count == 200, timeout=30, message="subscribers"
        )
        # Subscribers hold no database connection: one LISTEN serves them all.
        listening = sql.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query LIKE 'LISTEN%%runlane_lane_changes%%'"
        ).fetchone()
        assert listening == (1,)
        connections = sql.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchone()
        assert connections is not None and connections[0] < 40
        gate.set()
        async with running_worker(streaming_app(settings, gate), settings):
            results = await asyncio.wait_for(asyncio.gather(*readers), 60)
    for events in results:
        assert [e.data["data"].get("i") for e in events[:-1]] == list(range(20))
        assert events[-1].event == "end"
    assert api.context.hub.subscriber_count == 0


async def test_subscribers_of_one_run_share_one_read_per_notification(
    api: ApiServer, key: str, service: RunService, settings: Settings
) -> None:
    gate = asyncio.Event()
    run, _ = await service.submit("talker", {}, user_id="ann", tenant="acme")
    hub = api.context.hub
    limits = httpx.Limits(max_connections=250, max_keepalive_connections=250)
    async with api.client(key, limits=limits) as client:
        readers = [
            asyncio.create_task(collect(client, f"/v1/runs/{run.id}/events")) for _ in range(200)
        ]
        await wait_until(lambda: hub.subscriber_count == 200, timeout=30, message="subscribers")
        reads, notifications = hub.reads, hub.notifications
        started = time.monotonic()
        gate.set()
        async with running_worker(streaming_app(settings, gate), settings):
            results = await asyncio.wait_for(asyncio.gather(*readers), 60)
        elapsed = time.monotonic() - started
    for events in results:
        assert [e.data["data"]["i"] for e in events[:-1]] == list(range(20))
        assert events[-1].event == "end"
    # 20 events and the final status: 21 notifications for this run, each
    # read once for all 200 subscribers (reading per subscriber would be
    # 200 per notification). Besides, at most one periodic re-read per
    # topic per half re-read interval.
    run_notifications = hub.notifications - notifications
    assert run_notifications >= 21
    periodic = 2 + elapsed / (hub.reread_seconds / 2)
    assert hub.reads - reads <= run_notifications + periodic


async def test_streams_behind_the_topic_window_replay_by_pages(
    api: ApiServer,
    key: str,
    service: RunService,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A small window and page, so that 20 events overflow both.
    monkeypatch.setattr(event_hub, "PAGE", 4)
    monkeypatch.setattr(event_hub, "WINDOW", 6)
    gate = asyncio.Event()
    run, _ = await service.submit("talker", {}, user_id="ann", tenant="acme")
    async with running_worker(streaming_app(settings, gate), settings), api.client(key) as client:
        live = asyncio.create_task(collect(client, f"/v1/runs/{run.id}/events"))
        await wait_until(lambda: _last_seq(service, run.id, 10), message="first half")
        topic = api.context.hub.run_topic(run.id)
        # The window moved past the start: the late subscribers below 4 replay by pages.
        await wait_until(lambda: topic.floor >= 4, message="the window moved on")
        late = [
            asyncio.create_task(collect(client, f"/v1/runs/{run.id}/events", **kwargs))
            for kwargs in ({}, {"headers": {"Last-Event-ID": "2"}}, {"params": {"after_seq": 9}})
        ]
        await wait_until(lambda: api.context.hub.subscriber_count == 4, message="subscribers")
        gate.set()
        results = await asyncio.wait_for(asyncio.gather(live, *late), 30)
    firsts = [0, 0, 2, 9]
    for first, events in zip(firsts, results, strict=True):
        assert [int(e.id or 0) for e in events[:-1]] == list(range(first + 1, 21))
        assert [e.data["data"]["i"] for e in events[:-1]] == list(range(first, 20))
        assert events[-1].event == "end" and events[-1].data["status"] == "completed"


async def test_a_lost_notify_only_delays_events(
    api: ApiServer, key: str, service: RunService, settings: Settings
) -> None:
    gate = asyncio.Event()
    gate.set()
    run, _ = await service.submit("talker", {}, user_id="ann", tenant="acme")
    await api.context.hub.stop()  # no NOTIFY reaches the API any more
    async with api.client(key) as client:
        reader = asyncio.create_task(collect(client, f"/v1/runs/{run.id}/events"))
        async with running_worker(streaming_app(settings, gate, count=5), settings):
            events = await asyncio.wait_for(reader, 30)
    assert [e.event for e in events] == ["token"] * 5 + ["end"]


async def test_without_notify_every_subscriber_of_a_run_still_gets_every_event(
    api: ApiServer, key: str, service: RunService, settings: Settings
) -> None:
    gate = asyncio.Event()
    gate.set()
    run, _ = await service.submit("talker", {}, user_id="ann", tenant="acme")
    await api.context.hub.stop()  # no NOTIFY reaches the API any more
    async with api.client(key) as client:
        readers = [
            asyncio.create_task(collect(client, f"/v1/runs/{run.id}/events")) for _ in range(5)
        ]
        await wait_until(lambda: api.context.hub.subscriber_count == 5, message="subscribers")
        async with running_worker(streaming_app(settings, gate, count=5), settings):
            results = await asyncio.wait_for(asyncio.gather(*readers), 30)
    for events in results:
        assert [e.event for e in events] == ["token"] * 5 + ["end"]
        assert [int(e.id or 0) for e in events[:-1]] == [1, 2, 3, 4, 5]


async def test_request_stream_shows_positions_then_the_run(
    api: ApiServer, key: str, service: RunService
) -> None:
    async with api.client(key) as client:

        async def submit(text: str) -> dict[str, Any]:
            response = await client.post(
                "/v1/threads/t1/requests", json={"agent": "chat", "input": {"text": text}}
            )
            assert response.status_code == 201
            body: dict[str, Any] = response.json()
            return body

        first = await submit("one")
        await submit("two")
        third = await submit("three")
        assert third["position"] == 2
        reader = asyncio.create_task(
            collect_request(client, f"/v1/requests/{third['request_id']}/events")
        )
        # Move the lane on twice by hand: cancel the head's run (the lane
        # pauses), cancel "two", continue.
        await wait_until(lambda: api.context.hub.subscriber_count == 1, message="subscriber")
        cancel = await client.post(f"/v1/runs/{first['run_id']}/cancel")
        assert cancel.status_code == 200
        two = (await client.get("/v1/threads/t1/queue", params={"agent": "chat"})).json()
        assert two["state"] == "paused"
        await client.post(f"/v1/requests/{two['queued'][0]['request_id']}/cancel")
        cont = await client.post("/v1/threads/t1/queue/continue", params={"agent": "chat"})
        assert cont.status_code == 200, cont.json()
        events = await asyncio.wait_for(reader, 30)
    assert [e.event for e in events] == ["queued", "queued", "dispatched"]
    assert [e.data.get("position") for e in events[:2]] == [2, 1]
    assert events[-1].data["run_id"] == cont.json()["run_id"]


async def collect_request(client: httpx.AsyncClient, path: str) -> list[SseEvent]:
    events: list[SseEvent] = []
    async with client.stream("GET", path) as response:
        assert response.status_code == 200
        async for item in read_events(response):
            if isinstance(item, SseEvent):
                events.append(item)
    return events


async def _status(service: RunService, run_id: Any, status: RunStatus) -> Any:
    run = await service.get(run_id)
    return run if run.status is status else None


async def _last_seq(service: RunService, run_id: Any, at_least: int) -> bool:
    return (await service.get(run_id)).last_event_seq >= at_least
