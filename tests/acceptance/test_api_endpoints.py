"""Every endpoint of the HTTP API (DESIGN.md §5, issue 4) and every error code
it answers with, through a real HTTP server (uvicorn on a free port).

Runs are driven to their ends without a worker: the tests claim and finish
them through the real store, as a worker would (tests/integration/
lane_helpers.py). Error bodies are always exactly
``{"error": {"code", "message"}}`` with the status of STATUS_BY_CODE.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runlane.api.errors import STATUS_BY_CODE
from runlane.lanes import Refusal
from runlane.models import ClaimedRun, Outcome
from runlane.settings import Settings
from runlane.store import RunStore
from tests.api_support import ApiServer, create_key, serve_api
from tests.integration.lane_helpers import finish

Conn = psycopg.Connection[Any]

AGENT = "bot"
WORKER = "worker-host-7.internal"


# -- helpers ----------------------------------------------------------------


@dataclass
class Keys:
    ann: str  # acme / ann, the owner of what the tests create
    admin: str  # acme / boss, an admin key


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[ApiServer]:
    async with serve_api(settings) as server:
        yield server


@pytest.fixture
async def keys(api: ApiServer) -> Keys:
    return Keys(
        ann=await create_key(api.context.keys, "acme", "ann"),
        admin=await create_key(api.context.keys, "acme", "boss", admin=True),
    )


@pytest.fixture
async def ann(api: ApiServer, keys: Keys) -> AsyncIterator[httpx.AsyncClient]:
    async with api.client(keys.ann) as client:
        yield client


@pytest.fixture
async def admin(api: ApiServer, keys: Keys) -> AsyncIterator[httpx.AsyncClient]:
    async with api.client(keys.admin) as client:
        yield client


def error_of(response: httpx.Response, status: int, code: str) -> str:
    """Asserts the documented error shape; returns the message."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    assert STATUS_BY_CODE[code] == status, f"{code} is documented as {STATUS_BY_CODE[code]}"
    message: str = body["error"]["message"]
    return message


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, (response.status_code, response.text)
    return response.json()


async def submit(
    client: httpx.AsyncClient,
    thread: str,
    text: str,
    *,
    policy: str = "enqueue",
    status: int = 201,
    **extra: Any,
) -> dict[str, Any]:
    body = {"agent": AGENT, "input": {"text": text}, "policy": policy, **extra}
    reply: dict[str, Any] = ok(
        await client.post(f"/v1/threads/{thread}/requests", json=body), status
    )
    return reply


async def direct_run(client: httpx.AsyncClient, **extra: Any) -> dict[str, Any]:
    body = {"agent": AGENT, "input": {"n": 1}, **extra}
    reply: dict[str, Any] = ok(await client.post("/v1/runs", json=body), 201)
    return reply


async def claim_run(store: RunStore, run_id: str | UUID, *, worker: str = WORKER) -> ClaimedRun:
    """Claims the next run, which must be ``run_id``: the tests keep one
    claimable run at a time."""
    batch = await store.claim_batch(worker_id=worker, limit=1, lease_seconds=60)
    assert batch, f"run {run_id} was not claimable"
    assert str(batch[0].id) == str(run_id), f"claimed {batch[0].id}, expected {run_id}"
    return batch[0]


async def end_run(store: RunStore, run_id: str | UUID, outcome: Outcome, **kwargs: Any) -> None:
    await finish(store, await claim_run(store, run_id), outcome, **kwargs)


def count(sql: Conn, table: str) -> int:
    row = sql.execute(f"SELECT count(*) FROM runlane.{table}").fetchone()
    assert row is not None
    return int(row[0])


async def read_sse(
    client: httpx.AsyncClient, path: str, *, timeout: float = 15, **kwargs: Any
) -> list[dict[str, Any]]:
    """The events of a stream that ends by itself (a finished run or request)."""
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout), client.stream("GET", path, **kwargs) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        current: dict[str, Any] = {}
        async for line in response.aiter_lines():
            if not line:
                if current:
                    events.append(current)
                current = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                current[name] = json.loads(value) if name == "data" else value
    return events


def metric(text: str, sample: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == sample and all(found.labels.get(k) == v for k, v in labels.items()):
                return float(found.value)
    return 0.0


# -- operations -------------------------------------------------------------

V1_PATHS = {
    ("post", "/v1/threads/{thread_id}/requests"),
    ("get", "/v1/threads/{thread_id}/queue"),
    ("post", "/v1/threads/{thread_id}/queue/continue"),
    ("get", "/v1/requests/{request_id}"),
    ("post", "/v1/requests/{request_id}/cancel"),
    ("post", "/v1/requests/{request_id}/steer"),
    ("get", "/v1/requests/{request_id}/events"),
    ("post", "/v1/runs"),
    ("get", "/v1/runs"),
    ("get", "/v1/runs/{run_id}"),
    ("post", "/v1/runs/{run_id}/cancel"),
    ("post", "/v1/runs/{run_id}/resume"),
    ("post", "/v1/runs/{run_id}/retry"),
    ("get", "/v1/runs/{run_id}/events"),
}


async def test_operations_endpoints_answer_without_a_key(api: ApiServer) -> None:
    async with api.client() as client:
        assert ok(await client.get("/healthz")) == {"status": "ok"}
        assert ok(await client.get("/readyz")) == {"status": "ready"}

        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        assert "runlane_api_requests_total" in metrics.text
        assert "runlane_sse_subscribers" in metrics.text

        docs = await client.get("/docs")
        assert docs.status_code == 200 and "text/html" in docs.headers["content-type"]
        assert "/openapi.json" in docs.text

        document = ok(await client.get("/openapi.json"))
    assert document["openapi"].startswith("3.")
    documented = {(m, p) for p, item in document["paths"].items() for m in item}
    assert documented >= V1_PATHS, V1_PATHS - documented
    assert {("get", "/healthz"), ("get", "/readyz"), ("get", "/metrics")} <= documented
    # Every error code is documented with its status.
    for code, status in STATUS_BY_CODE.items():
        assert f"`{code}`: {status}" in document["info"]["description"], code
    # Request bodies carry examples.
    schemas = document["components"]["schemas"]
    for name in ("RequestSubmission", "RunSubmission", "ResumeBody"):
        assert schemas[name].get("examples"), name


async def test_readyz_is_503_until_the_schema_is_migrated(
    settings: Settings, empty_db_url: str
) -> None:
    unmigrated = settings.model_copy(update={"database_url": empty_db_url})
    async with serve_api(unmigrated) as server, server.client() as client:
        assert ok(await client.get("/healthz")) == {"status": "ok"}
        message = error_of(await client.get("/readyz"), 503, "database_unavailable")
    assert "migrations not applied" in message


# -- unauthorized (401) -----------------------------------------------------

ENDPOINTS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/v1/threads/t1/requests", {"agent": AGENT}),
    ("GET", "/v1/threads/t1/queue?agent=bot", None),
    ("POST", "/v1/threads/t1/queue/continue?agent=bot", None),
    ("GET", "/v1/requests/{request}", None),
    ("POST", "/v1/requests/{request}/cancel", None),
    ("POST", "/v1/requests/{request}/steer", None),
    ("GET", "/v1/requests/{request}/events", None),
    ("POST", "/v1/runs", {"agent": AGENT}),
    ("GET", "/v1/runs", None),
    ("GET", "/v1/runs/{run}", None),
    ("POST", "/v1/runs/{run}/cancel", None),
    ("POST", "/v1/runs/{run}/resume", {"value": 1}),
    ("POST", "/v1/runs/{run}/retry", None),
    ("GET", "/v1/runs/{run}/events", None),
]


async def test_every_v1_endpoint_needs_a_valid_key(
    api: ApiServer, keys: Keys, ann: httpx.AsyncClient, sql: Conn
) -> None:
    # Real objects: a refusal must not depend on whether they exist.
    request = await submit(ann, "t1", "hello", request_id="r-1")
    revoked_key = await create_key(api.context.keys, "acme", "ann")
    await api.context.keys.revoke(revoked_key[: revoked_key.index("_", 3)])
    bad_headers = {
        "no header": {},
        "basic scheme": {"Authorization": "Basic YW5uOnNlY3JldA=="},
        "token scheme": {"Authorization": f"Token {keys.ann}"},
        "bearer without key": {"Authorization": "Bearer"},
        "bearer and a space": {"Authorization": "Bearer  x"},
        "unknown key": {"Authorization": "Bearer rl_00000000_nosuchkey"},
        "not a runlane key": {"Authorization": "Bearer hunter2"},
        "truncated key": {"Authorization": f"Bearer {keys.ann[:-1]}"},
        "oversized key": {"Authorization": f"Bearer rl_{'x' * 300}"},
        "revoked key": {"Authorization": f"Bearer {revoked_key}"},
    }
    runs_before, requests_before = count(sql, "runs"), count(sql, "requests")
    async with api.client() as client:
        for method, template, body in ENDPOINTS:
            path = template.format(run=request["run_id"], request=request["request_id"])
            for label, headers in bad_headers.items():
                response = await client.request(method, path, json=body, headers=headers)
                message = error_of(response, 401, "unauthorized")
                assert keys.ann not in message, (method, path, label)
    assert (count(sql, "runs"), count(sql, "requests")) == (runs_before, requests_before)


async def test_the_bearer_scheme_is_case_insensitive_and_revocation_is_immediate(
    api: ApiServer,
) -> None:
    secret = await create_key(api.context.keys, "acme", "ann")
    async with api.client() as client:
        assert ok(await client.get("/v1/runs", headers={"Authorization": f"bearer {secret}"}))
        assert ok(await client.get("/v1/runs", headers={"Authorization": f"Bearer {secret}"}))
        revoked = await api.context.keys.revoke(secret[: secret.index("_", 3)])
        assert revoked.revoked_at is not None
        response = await client.get("/v1/runs", headers={"Authorization": f"Bearer {secret}"})
        assert "revoked" in error_of(response, 401, "unauthorized")


async def test_a_401_names_the_bearer_scheme(api: ApiServer) -> None:
    async with api.client() as client:
        response = await client.get("/v1/runs")
    assert response.status_code == 401
    assert response.headers.get("www-authenticate", "").lower().startswith("bearer")


# -- forbidden (403) ----------------------------------------------------------


async def test_retry_needs_an_admin_key(
    ann: httpx.AsyncClient, admin: httpx.AsyncClient, store: RunStore
) -> None:
    run = await direct_run(ann)
    await end_run(store, run["run_id"], Outcome.FAILED, error={"code": "boom", "message": "x"})
    # Not even the run's owner may re-queue it; nor may anyone probe ids.
    error_of(await ann.post(f"/v1/runs/{run['run_id']}/retry"), 403, "forbidden")
    error_of(await ann.post(f"/v1/runs/{uuid4()}/retry"), 403, "forbidden")
    assert ok(await ann.get(f"/v1/runs/{run['run_id']}"))["status"] == "failed"

    retried = ok(await admin.post(f"/v1/runs/{run['run_id']}/retry"))
    assert (retried["run_id"], retried["status"], retried["attempts"]) == (
        run["run_id"],
        "pending",
        0,
    )
    assert retried["error"] is None and retried["finished_at"] is None


# -- not found (404) and unknown routes ---------------------------------------


async def test_unknown_objects_answer_404(ann: httpx.AsyncClient, admin: httpx.AsyncClient) -> None:
    for run_id in (str(uuid4()), "not-a-uuid", "0"):
        error_of(await ann.get(f"/v1/runs/{run_id}"), 404, "not_found")
        error_of(await ann.post(f"/v1/runs/{run_id}/cancel"), 404, "not_found")
        error_of(await ann.post(f"/v1/runs/{run_id}/resume", json={"value": 1}), 404, "not_found")
        error_of(await admin.post(f"/v1/runs/{run_id}/retry"), 404, "not_found")
        error_of(await ann.get(f"/v1/runs/{run_id}/events"), 404, "not_found")
    for request_id in ("nope", str(uuid4())):
        error_of(await ann.get(f"/v1/requests/{request_id}"), 404, "not_found")
        error_of(await ann.post(f"/v1/requests/{request_id}/cancel"), 404, "not_found")
        error_of(await ann.post(f"/v1/requests/{request_id}/steer"), 404, "not_found")
        error_of(await ann.get(f"/v1/requests/{request_id}/events"), 404, "not_found")
    error_of(await ann.get("/v1/nothing-here"), 404, "not_found")
    error_of(await ann.get("/v2/runs"), 404, "not_found")


async def test_a_wrong_method_answers_405(ann: httpx.AsyncClient) -> None:
    error_of(await ann.delete("/v1/runs"), 405, "method_not_allowed")
    error_of(await ann.put("/v1/runs/x"), 405, "method_not_allowed")
    error_of(await ann.get("/v1/runs/x/cancel"), 405, "method_not_allowed")


async def test_a_405_names_the_allowed_methods(ann: httpx.AsyncClient) -> None:
    response = await ann.delete("/v1/runs")
    assert response.status_code == 405
    assert "allow" in response.headers
    assert {m.strip() for m in response.headers["allow"].split(",")} == {"GET", "POST"}


# -- validation_error (422) ---------------------------------------------------

LONG = "x" * 201
JSON = {"content-type": "application/json"}


def b64(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


INVALID: list[tuple[str, str, dict[str, Any]]] = [
    # thread_id: charset and length
    ("POST", "/v1/threads/bad thread/requests", {"json": {"agent": AGENT}}),
    ("POST", "/v1/threads/-leading-dash/requests", {"json": {"agent": AGENT}}),
    ("POST", f"/v1/threads/{LONG}/requests", {"json": {"agent": AGENT}}),
    ("GET", "/v1/threads/bad thread/queue?agent=bot", {}),
    ("GET", f"/v1/threads/{LONG}/queue?agent=bot", {}),
    ("POST", "/v1/threads/b%C3%A4d/queue/continue?agent=bot", {}),
    # agent: charset, length, presence
    ("POST", "/v1/threads/t1/requests", {"json": {"agent": "bad agent"}}),
    ("POST", "/v1/threads/t1/requests", {"json": {"agent": "-bot"}}),
    ("POST", "/v1/threads/t1/requests", {"json": {"agent": "a" * 129}}),
    ("POST", "/v1/threads/t1/requests", {"json": {"input": {}}}),
    ("GET", "/v1/threads/t1/queue", {}),
    ("GET", "/v1/threads/t1/queue?agent=bad agent", {}),
    ("POST", "/v1/threads/t1/queue/continue", {}),
    ("POST", "/v1/threads/t1/queue/continue?agent=" + "a" * 129, {}),
    ("POST", "/v1/runs", {"json": {"agent": "bad/agent"}}),
    ("POST", "/v1/runs", {"json": {"agent": "a" * 129}}),
    ("GET", "/v1/runs?agent=" + "a" * 129, {}),
    # request_id: charset and length, in bodies and paths
    ("POST", "/v1/threads/t1/requests", {"json": {"agent": AGENT, "request_id": "has space"}}),
    ("POST", "/v1/threads/t1/requests", {"json": {"agent": AGENT, "request_id": ""}}),
    ("POST", "/v1/threads/t1/requests", {"json": {"agent": AGENT, "request_id": LONG}}),
    ("GET", "/v1/requests/bad id", {}),
    ("GET", f"/v1/requests/{LONG}", {}),
    ("POST", "/v1/requests/bad id/cancel", {}),
    ("POST", f"/v1/requests/{LONG}/steer", {}),
    ("GET", "/v1/requests/bad id/events", {}),
    # other fields
    ("POST", "/v1/threads/t1/requests", {"json": {"agent": AGENT, "policy": "shove"}}),
    ("POST", "/v1/threads/t1/requests", {"json": {"agent": AGENT, "priority": 1001}}),
    ("POST", "/v1/threads/t1/requests", {"json": {"agent": AGENT, "metadata": [1]}}),
    ("POST", "/v1/runs", {"json": {"agent": AGENT, "max_attempts": 0}}),
    ("POST", "/v1/runs", {"json": {"agent": AGENT, "max_attempts": 101}}),
    ("POST", "/v1/runs", {"json": {"agent": AGENT, "delay_seconds": -1}}),
    ("POST", "/v1/runs", {"json": {"agent": AGENT, "priority": -1001}}),
    ("POST", "/v1/runs", {"json": {"agent": AGENT, "budget": {"max_turns": 0}}}),
    ("POST", "/v1/runs", {"json": {"agent": AGENT, "idempotency_key": ""}}),
    ("POST", "/v1/runs", {"json": {"agent": AGENT, "idempotency_key": LONG}}),
    ("POST", "/v1/runs", {"content": b'{"agent": "bot", "input": NaN}', "headers": JSON}),
    ("POST", "/v1/runs", {"content": b'{"agent": "bot", "input": 1e999}', "headers": JSON}),
    # unknown body fields, anywhere
    ("POST", "/v1/threads/t1/requests", {"json": {"agent": AGENT, "bogus": 1}}),
    ("POST", "/v1/runs", {"json": {"agent": AGENT, "bogus": 1}}),
    ("POST", "/v1/runs", {"json": {"agent": AGENT, "budget": {"max_tokens": 5}}}),
    ("POST", "/v1/runs/{run}/resume", {"json": {"value": 1, "bogus": 1}}),
    ("POST", "/v1/runs/{run}/resume", {"json": {}}),
    # bodies that are not the expected JSON
    ("POST", "/v1/runs", {"content": b"{not json", "headers": JSON}),
    ("POST", "/v1/runs", {"json": [AGENT]}),
    ("POST", "/v1/threads/t1/requests", {"json": "bot"}),
    ("POST", "/v1/threads/t1/requests", {}),
    # listing: cursor, limit, status
    ("GET", "/v1/runs?cursor=garbage", {}),
    ("GET", "/v1/runs?cursor=" + b64("2026-01-01T00:00:00+00:00|not-a-uuid"), {}),
    ("GET", "/v1/runs?cursor=" + b64(f"yesterday|{uuid4()}"), {}),
    ("GET", "/v1/runs?cursor=" + "c" * 201, {}),
    ("GET", "/v1/runs?limit=0", {}),
    ("GET", "/v1/runs?limit=-1", {}),
    ("GET", "/v1/runs?limit=201", {}),
    ("GET", "/v1/runs?limit=many", {}),
    ("GET", "/v1/runs?status=bogus", {}),
    # event streams
    ("GET", "/v1/runs/{run}/events?after_seq=-1", {}),
    ("GET", "/v1/runs/{run}/events?after_seq=x", {}),
    ("GET", "/v1/runs/{run}/events", {"headers": {"Last-Event-ID": "abc"}}),
    ("GET", "/v1/runs/{run}/events", {"headers": {"Last-Event-ID": "1" * 41}}),
]


async def test_invalid_input_answers_422_and_stores_nothing(
    ann: httpx.AsyncClient, sql: Conn
) -> None:
    run = await direct_run(ann)
    before = (count(sql, "runs"), count(sql, "requests"), count(sql, "lanes"))
    for method, template, kwargs in INVALID:
        path = template.format(run=run["run_id"])
        response = await ann.request(method, path, **kwargs)
        assert response.status_code == 422, (method, path, kwargs, response.text)
        error_of(response, 422, "validation_error")
    assert (count(sql, "runs"), count(sql, "requests"), count(sql, "lanes")) == before


# -- unknown_agent (422) --------------------------------------------------------


async def test_unknown_agent_is_refused_when_the_registry_is_known(
    settings: Settings, sql: Conn
) -> None:
    async with serve_api(settings, agents=frozenset({AGENT, "writer"})) as server:
        key = await create_key(server.context.keys, "acme", "ann")
        async with server.client(key) as client:
            message = error_of(
                await client.post("/v1/runs", json={"agent": "ghost"}), 422, "unknown_agent"
            )
            assert "ghost" in message
            error_of(
                await client.post("/v1/threads/t1/requests", json={"agent": "ghost"}),
                422,
                "unknown_agent",
            )
            assert (count(sql, "runs"), count(sql, "requests")) == (0, 0)
            ok(await client.post("/v1/runs", json={"agent": "writer"}), 201)
            ok(await client.post("/v1/threads/t1/requests", json={"agent": AGENT}), 201)


async def test_without_a_registry_any_agent_name_is_accepted(ann: httpx.AsyncClient) -> None:
    assert (await direct_run(ann, agent="not-served-anywhere"))["status"] == "pending"


# -- payload_too_large (413) ------------------------------------------------------


@pytest.fixture
async def small_api(settings: Settings) -> AsyncIterator[tuple[ApiServer, str]]:
    small = settings.model_copy(update={"max_body_bytes": 4096, "max_input_bytes": 1024})
    async with serve_api(small) as server:
        yield server, await create_key(server.context.keys, "acme", "ann")


async def test_a_body_over_the_limit_answers_413(
    small_api: tuple[ApiServer, str], store: RunStore, sql: Conn
) -> None:
    server, key = small_api
    async with server.client(key) as client:
        interrupted = await direct_run(client)
        await end_run(store, interrupted["run_id"], Outcome.INTERRUPTED, interrupt={"ask": 1})
        before = (count(sql, "runs"), count(sql, "requests"))
        big = "x" * 5000
        for path, body in [
            ("/v1/runs", {"agent": AGENT, "input": big}),
            ("/v1/threads/t1/requests", {"agent": AGENT, "input": big}),
            (f"/v1/runs/{interrupted['run_id']}/resume", {"value": big}),
        ]:
            message = error_of(await client.post(path, json=body), 413, "payload_too_large")
            assert "4096" in message
        # Declared length over the limit: refused before the body is read.
        raw = json.dumps({"agent": AGENT, "input": big}).encode()
        response = await client.post(
            "/v1/runs", content=raw, headers={"content-type": "application/json"}
        )
        error_of(response, 413, "payload_too_large")
        assert (count(sql, "runs"), count(sql, "requests")) == before


async def test_an_input_over_its_limit_answers_413(
    small_api: tuple[ApiServer, str], store: RunStore, sql: Conn
) -> None:
    server, key = small_api
    async with server.client(key) as client:
        interrupted = await direct_run(client)
        await end_run(store, interrupted["run_id"], Outcome.INTERRUPTED, interrupt={"ask": 1})
        before = (count(sql, "runs"), count(sql, "requests"))
        # The body fits in 4096 bytes; the input does not fit in 1024.
        big = "y" * 2000
        for path, body in [
            ("/v1/runs", {"agent": AGENT, "input": {"text": big}}),
            ("/v1/threads/t1/requests", {"agent": AGENT, "input": {"text": big}}),
            (f"/v1/runs/{interrupted['run_id']}/resume", {"value": {"text": big}}),
        ]:
            message = error_of(await client.post(path, json=body), 413, "payload_too_large")
            assert "1024" in message, message
        assert (count(sql, "runs"), count(sql, "requests")) == before
        # Just under both limits is fine.
        ok(await client.post("/v1/runs", json={"agent": AGENT, "input": "z" * 900}), 201)


async def test_a_streamed_body_over_the_limit_answers_413(
    small_api: tuple[ApiServer, str],
) -> None:
    server, key = small_api

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"agent": "bot", "input": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    async with server.client(key) as client:
        response = await client.post(
            "/v1/runs", content=chunks(), headers={"content-type": "application/json"}
        )
        assert "content-length" not in response.request.headers
        error_of(response, 413, "payload_too_large")


# -- bodies the database cannot store, and bytes that are not UTF-8 ---------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/runs", {"agent": AGENT, "input": "a\u0000b"}),
        ("POST", "/v1/runs", {"agent": AGENT, "input": {"k\u0000": 1}}),
        ("POST", "/v1/runs", {"agent": AGENT, "metadata": {"m": "\u0000"}}),
        ("POST", "/v1/runs", {"agent": AGENT, "idempotency_key": "a\u0000b"}),
        ("POST", "/v1/threads/t1/requests", {"agent": AGENT, "input": "a\u0000b"}),
        ("POST", "/v1/runs/{run}/resume", {"value": "a\u0000b"}),
        ("GET", "/v1/runs?agent=a%00b", None),
        ("GET", "/v1/runs?thread_id=a%00b", None),
    ],
    ids=[
        "run input",
        "run input key",
        "run metadata",
        "idempotency key",
        "request input",
        "resume value",
        "list agent",
        "list thread",
    ],
)
async def test_a_nul_character_answers_422(
    ann: httpx.AsyncClient,
    store: RunStore,
    method: str,
    path: str,
    body: dict[str, Any] | None,
) -> None:
    run_id = ""
    if "{run}" in path:
        interrupted = await direct_run(ann)
        run_id = interrupted["run_id"]
        await end_run(store, run_id, Outcome.INTERRUPTED, interrupt={})
    response = await ann.request(method, path.format(run=run_id), json=body)
    error_of(response, 422, "validation_error")


async def test_a_lone_surrogate_answers_422(ann: httpx.AsyncClient) -> None:
    response = await ann.post(
        "/v1/runs",
        content=b'{"agent": "bot", "input": "\\ud800"}',
        headers={"content-type": "application/json"},
    )
    error_of(response, 422, "validation_error")


@pytest.mark.parametrize(
    ("path", "content"),
    [
        ("/v1/runs", b'{"agent": "b\x80t"}'),
        ("/v1/threads/t1/requests", b'{"agent": "b\x80t"}'),
        ("/v1/runs/00000000-0000-0000-0000-000000000000/resume", b'{"value": "\xff"}'),
        ("/v1/runs", b'{"agent": "bot", "input": ' + b"9" * 5000 + b"}"),
        ("/v1/runs", b'{"agent": "bot", "input": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ],
    ids=["run not utf-8", "request not utf-8", "resume not utf-8", "huge integer", "deep"],
)
async def test_an_unparseable_body_answers_422(
    ann: httpx.AsyncClient, path: str, content: bytes
) -> None:
    response = await ann.post(path, content=content, headers=JSON)
    error_of(response, 422, "validation_error")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/runs", {"agent": AGENT, "priority": True}),
        ("/v1/runs", {"agent": AGENT, "priority": "5"}),
        ("/v1/runs", {"agent": AGENT, "max_attempts": True}),
        ("/v1/runs", {"agent": AGENT, "delay_seconds": "3"}),
        ("/v1/runs", {"agent": AGENT, "budget": {"max_turns": True}}),
        ("/v1/threads/t1/requests", {"agent": AGENT, "priority": True}),
    ],
    ids=[
        "run priority true",
        "run priority string",
        "run max_attempts true",
        "run delay string",
        "run max_turns true",
        "request priority true",
    ],
)
async def test_a_wrongly_typed_number_answers_422(
    ann: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> None:
    error_of(await ann.post(path, json=body), 422, "validation_error")


# -- requests: submit, read, idempotency, rejection -------------------------------


async def test_submit_read_and_replay_a_request(ann: httpx.AsyncClient, sql: Conn) -> None:
    first = await submit(ann, "t1", "hello", request_id="msg-1", metadata={"source": "web"})
    assert first["request_id"] == "msg-1" and first["thread_id"] == "t1"
    assert (first["status"], first["policy"], first["steer"]) == ("dispatched", "enqueue", False)
    assert first["position"] is None and first["reason"] is None
    assert first["input"] == {"text": "hello"} and first["dispatched_at"] is not None
    UUID(first["run_id"])

    # The same request again: 200 and the same request, nothing new stored.
    runs = count(sql, "runs")
    again = await submit(
        ann, "t1", "hello", request_id="msg-1", metadata={"source": "web"}, status=200
    )
    assert again == first
    assert count(sql, "runs") == runs
    assert ok(await ann.get("/v1/requests/msg-1")) == first

    # A request_id is generated when absent.
    second = await submit(ann, "t1", "second")
    assert second["request_id"] and second["request_id"] != "msg-1"
    assert (second["status"], second["position"], second["run_id"]) == ("queued", 1, None)
    assert ok(await ann.get(f"/v1/requests/{second['request_id']}"))["position"] == 1

    run = ok(await ann.get(f"/v1/runs/{first['run_id']}"))
    assert (run["thread_id"], run["kind"], run["agent"]) == ("t1", "request", AGENT)
    assert run["input"] == {"text": "hello"} and run["status"] == "pending"


async def test_a_lane_run_names_its_request(ann: httpx.AsyncClient) -> None:
    request = await submit(ann, "t1", "hello", request_id="msg-1")
    run = ok(await ann.get(f"/v1/runs/{request['run_id']}"))
    assert run["request_id"] == "msg-1"
    assert ok(await ann.get("/v1/runs"))["items"][0]["request_id"] == "msg-1"
    assert (await direct_run(ann))["request_id"] is None


async def test_rejected_requests_are_results_not_errors(
    ann: httpx.AsyncClient, store: RunStore
) -> None:
    first = await submit(ann, "t1", "one")
    # Busy lane: stored as rejected, answered 201 with a reason.
    busy = await submit(ann, "t1", "two", policy="reject", request_id="rej-1")
    assert (busy["status"], busy["reason"], busy["run_id"], busy["position"]) == (
        "rejected",
        "lane_busy",
        None,
        None,
    )
    assert busy["ended_at"] is not None
    assert await submit(ann, "t1", "two", policy="reject", request_id="rej-1", status=200) == busy
    assert ok(await ann.get("/v1/requests/rej-1")) == busy

    # Paused lane: lane_paused.
    await submit(ann, "t1", "three")
    await end_run(store, first["run_id"], Outcome.FAILED)
    paused = await submit(ann, "t1", "four", policy="reject")
    assert (paused["status"], paused["reason"]) == ("rejected", "lane_paused")

    # Idle lane: reject dispatches like enqueue.
    idle = await submit(ann, "t2", "x", policy="reject")
    assert idle["status"] == "dispatched" and idle["run_id"]


async def test_steer_on_an_idle_lane_dispatches_at_once(ann: httpx.AsyncClient) -> None:
    steer = await submit(ann, "t1", "now", policy="steer")
    assert (steer["status"], steer["steer"], steer["policy"]) == ("dispatched", True, "steer")


# -- the lane snapshot and continue ----------------------------------------------


async def test_queue_snapshot_and_continue(
    ann: httpx.AsyncClient, store: RunStore, sql: Conn
) -> None:
    idle = ok(await ann.get("/v1/threads/t1/queue", params={"agent": AGENT}))
    assert idle == {
        "thread_id": "t1",
        "agent": AGENT,
        "state": "idle",
        "paused_reason": None,
        "run_id": None,
        "queued": [],
    }
    message = error_of(
        await ann.post("/v1/threads/t1/queue/continue", params={"agent": AGENT}),
        409,
        "queue_not_paused",
    )
    assert "not paused" in message

    first = await submit(ann, "t1", "one")
    await submit(ann, "t1", "two", request_id="two")
    await submit(ann, "t1", "three", request_id="three")
    running = ok(await ann.get("/v1/threads/t1/queue", params={"agent": AGENT}))
    assert (running["state"], running["run_id"]) == ("running", first["run_id"])
    assert [(r["request_id"], r["position"]) for r in running["queued"]] == [
        ("two", 1),
        ("three", 2),
    ]
    error_of(
        await ann.post("/v1/threads/t1/queue/continue", params={"agent": AGENT}),
        409,
        "run_active",
    )

    await end_run(store, first["run_id"], Outcome.FAILED, error={"code": "boom"})
    paused = ok(await ann.get("/v1/threads/t1/queue", params={"agent": AGENT}))
    assert (paused["state"], paused["paused_reason"], paused["run_id"]) == (
        "paused",
        "run_failed",
        first["run_id"],
    )
    head = ok(await ann.post("/v1/threads/t1/queue/continue", params={"agent": AGENT}))
    assert (head["request_id"], head["status"]) == ("two", "dispatched")
    after = ok(await ann.get("/v1/threads/t1/queue", params={"agent": AGENT}))
    assert (after["state"], after["run_id"]) == ("running", head["run_id"])
    assert [r["request_id"] for r in after["queued"]] == ["three"]

    # queue_empty needs a paused lane with nothing queued, which no API call
    # leaves behind (cancelling the last waiting request un-pauses the lane):
    # only an operator's direct edit does. Checked here for its HTTP mapping.
    await end_run(store, head["run_id"], Outcome.FAILED)
    assert ok(await ann.get("/v1/threads/t1/queue", params={"agent": AGENT}))["state"] == "paused"
    sql.execute("UPDATE runlane.requests SET status = 'failed' WHERE status = 'queued'")
    error_of(
        await ann.post("/v1/threads/t1/queue/continue", params={"agent": AGENT}),
        409,
        "queue_empty",
    )


# -- lane refusals over HTTP --------------------------------------------------------


async def test_an_interrupted_lane_refuses_new_work(
    ann: httpx.AsyncClient, admin: httpx.AsyncClient, store: RunStore, sql: Conn
) -> None:
    older = await submit(ann, "t1", "zero")
    await end_run(store, older["run_id"], Outcome.FAILED)
    first = await submit(ann, "t1", "one")
    await submit(ann, "t1", "two", request_id="two")
    await end_run(store, first["run_id"], Outcome.INTERRUPTED, interrupt={"ask": "ok?"})
    snapshot = ok(await ann.get("/v1/threads/t1/queue", params={"agent": AGENT}))
    assert (snapshot["state"], snapshot["run_id"]) == ("interrupted", first["run_id"])

    before = count(sql, "requests")
    for policy in ("enqueue", "steer"):
        response = await ann.post(
            "/v1/threads/t1/requests", json={"agent": AGENT, "input": 3, "policy": policy}
        )
        assert "resume" in error_of(response, 409, "run_interrupted")
    error_of(
        await ann.post("/v1/threads/t1/queue/continue", params={"agent": AGENT}),
        409,
        "run_interrupted",
    )
    error_of(await ann.post("/v1/requests/two/steer"), 409, "run_interrupted")
    # Re-queueing an older run of the lane does not bypass the interrupt.
    error_of(await admin.post(f"/v1/runs/{older['run_id']}/retry"), 409, "run_interrupted")
    assert count(sql, "requests") == before

    rejected = await submit(ann, "t1", "four", policy="reject")
    assert (rejected["status"], rejected["reason"]) == ("rejected", "run_interrupted")


async def test_steer_refusals(ann: httpx.AsyncClient, store: RunStore, sql: Conn) -> None:
    first = await submit(ann, "t1", "one")
    await claim_run(store, first["run_id"])
    waiting = await submit(ann, "t1", "two", request_id="two")
    steer = await submit(ann, "t1", "stop", policy="steer", request_id="steer-1")
    assert (steer["status"], steer["steer"], steer["position"]) == ("queued", True, 1)
    assert ok(await ann.get("/v1/requests/two"))["position"] == 2
    before = count(sql, "requests")
    response = await ann.post(
        "/v1/threads/t1/requests", json={"agent": AGENT, "input": 2, "policy": "steer"}
    )
    error_of(response, 409, "steer_already_pending")
    assert count(sql, "requests") == before
    error_of(
        await ann.post(f"/v1/requests/{waiting['request_id']}/steer"), 409, "steer_already_pending"
    )
    # The running run was asked to yield to this steer: too late to cancel it.
    error_of(await ann.post("/v1/requests/steer-1/cancel"), 409, "steer_in_progress")
    assert ok(await ann.get("/v1/requests/steer-1"))["status"] == "queued"
    # Promoting the steer itself again changes nothing.
    assert ok(await ann.post("/v1/requests/steer-1/steer"))["steer"] is True


async def test_promote_a_queued_request_to_steer(ann: httpx.AsyncClient, store: RunStore) -> None:
    first = await submit(ann, "t1", "one")
    await claim_run(store, first["run_id"])
    await submit(ann, "t1", "two", request_id="two")
    await submit(ann, "t1", "three", request_id="three")
    promoted = ok(await ann.post("/v1/requests/three/steer"))
    assert (promoted["steer"], promoted["position"], promoted["status"]) == (True, 1, "queued")
    assert ok(await ann.get("/v1/requests/two"))["position"] == 2


async def test_request_id_conflicts(ann: httpx.AsyncClient, sql: Conn) -> None:
    await submit(ann, "t1", "hello", request_id="msg-1")
    before = count(sql, "requests")
    for thread, text, policy in [("t1", "other", "enqueue"), ("t2", "hello", "enqueue")]:
        response = await ann.post(
            f"/v1/threads/{thread}/requests",
            json={"agent": AGENT, "input": {"text": text}, "policy": policy, "request_id": "msg-1"},
        )
        assert "msg-1" in error_of(response, 409, "request_id_conflict")
    assert count(sql, "requests") == before


async def test_only_queued_requests_can_be_cancelled_or_steered(
    ann: httpx.AsyncClient, store: RunStore
) -> None:
    first = await submit(ann, "t1", "one", request_id="one")
    error_of(await ann.post("/v1/requests/one/cancel"), 409, "request_already_dispatched")
    error_of(await ann.post("/v1/requests/one/steer"), 409, "request_already_dispatched")

    rejected = await submit(ann, "t1", "no", policy="reject", request_id="rej")
    assert rejected["status"] == "rejected"
    error_of(await ann.post("/v1/requests/rej/cancel"), 409, "request_not_queued")
    error_of(await ann.post("/v1/requests/rej/steer"), 409, "request_not_queued")

    await submit(ann, "t1", "two", request_id="two")
    await submit(ann, "t1", "three", request_id="three")
    cancelled = ok(await ann.post("/v1/requests/two/cancel"))
    assert (cancelled["status"], cancelled["position"]) == ("cancelled", None)
    assert cancelled["ended_at"] is not None
    # Cancelling again is harmless; the requests behind it moved up.
    assert ok(await ann.post("/v1/requests/two/cancel"))["status"] == "cancelled"
    assert ok(await ann.get("/v1/requests/three"))["position"] == 1
    error_of(await ann.post("/v1/requests/two/steer"), 409, "request_not_queued")

    await end_run(store, first["run_id"], Outcome.COMPLETED, output="done")
    dispatched = ok(await ann.get("/v1/requests/three"))
    assert dispatched["status"] == "dispatched" and dispatched["run_id"]


async def test_requeue_respects_the_lane(
    ann: httpx.AsyncClient, admin: httpx.AsyncClient, store: RunStore
) -> None:
    # run_active: the lane has another active run.
    first = await submit(ann, "t1", "one")
    await end_run(store, first["run_id"], Outcome.FAILED)
    second = await submit(ann, "t1", "two")
    error_of(await admin.post(f"/v1/runs/{first['run_id']}/retry"), 409, "run_active")
    # lane_paused: the lane is paused by a later run; re-queueing an older
    # one must not bypass the pause.
    await submit(ann, "t1", "three")
    await end_run(store, second["run_id"], Outcome.FAILED)
    message = error_of(await admin.post(f"/v1/runs/{first['run_id']}/retry"), 409, "lane_paused")
    assert second["run_id"] in message
    # The run that paused the lane may be re-queued: that lifts the pause.
    retried = ok(await admin.post(f"/v1/runs/{second['run_id']}/retry"))
    assert retried["status"] == "pending"
    snapshot = ok(await ann.get("/v1/threads/t1/queue", params={"agent": AGENT}))
    assert (snapshot["state"], snapshot["run_id"]) == ("running", second["run_id"])


async def test_every_lane_refusal_is_documented_as_409() -> None:
    for code in Refusal:
        assert STATUS_BY_CODE[str(code)] == 409, code


# -- direct runs ------------------------------------------------------------------


async def test_submit_and_replay_a_direct_run(ann: httpx.AsyncClient, sql: Conn) -> None:
    body = {
        "agent": "writer",
        "input": {"topic": "Q3"},
        "priority": 5,
        "delay_seconds": 3600,
        "max_attempts": 2,
        "budget": {"max_seconds": 600, "max_turns": 10},
        "idempotency_key": "report-q3",
        "metadata": {"team": "finance"},
    }
    created = ok(await ann.post("/v1/runs", json=body), 201)
    assert created["status"] == "pending" and created["kind"] == "direct"
    assert (created["agent"], created["input"], created["priority"]) == (
        "writer",
        {"topic": "Q3"},
        5,
    )
    assert (created["max_attempts"], created["attempts"]) == (2, 0)
    assert created["budget"] == {"max_seconds": 600, "max_turns": 10}
    assert created["metadata"] == {"team": "finance"}
    assert created["thread_id"] is None and created["worker_id"] is None
    assert created["available_at"] > created["created_at"]

    runs = count(sql, "runs")
    again = ok(await ann.post("/v1/runs", json=body), 200)
    assert again["run_id"] == created["run_id"]
    assert count(sql, "runs") == runs
    read = ok(await ann.get(f"/v1/runs/{created['run_id']}"))
    assert read["run_id"] == created["run_id"] and read["attempt_history"] == []


async def test_cancel_a_run(ann: httpx.AsyncClient, store: RunStore) -> None:
    pending = await direct_run(ann)
    cancelled = ok(await ann.post(f"/v1/runs/{pending['run_id']}/cancel"))
    assert cancelled["status"] == "cancelled"
    assert ok(await ann.post(f"/v1/runs/{pending['run_id']}/cancel"))["status"] == "cancelled"

    running = await direct_run(ann)
    await claim_run(store, running["run_id"])
    assert ok(await ann.post(f"/v1/runs/{running['run_id']}/cancel"))["status"] == (
        "cancel_requested"
    )

    done = await direct_run(ann)
    await end_run(store, done["run_id"], Outcome.COMPLETED, output={"answer": 42})
    message = error_of(await ann.post(f"/v1/runs/{done['run_id']}/cancel"), 409, "run_finished")
    assert "completed" in message
    assert ok(await ann.get(f"/v1/runs/{done['run_id']}"))["output"] == {"answer": 42}


async def test_retry_only_failed_or_dead_runs(
    ann: httpx.AsyncClient, admin: httpx.AsyncClient, store: RunStore
) -> None:
    pending = await direct_run(ann)
    error_of(await admin.post(f"/v1/runs/{pending['run_id']}/retry"), 409, "not_retryable")
    await end_run(store, pending["run_id"], Outcome.COMPLETED)
    error_of(await admin.post(f"/v1/runs/{pending['run_id']}/retry"), 409, "not_retryable")

    dead = await direct_run(ann, max_attempts=1)
    await end_run(store, dead["run_id"], Outcome.RETRY, retry_delay_seconds=0)
    assert ok(await ann.get(f"/v1/runs/{dead['run_id']}"))["status"] == "dead"
    retried = ok(await admin.post(f"/v1/runs/{dead['run_id']}/retry"))
    assert (retried["status"], retried["attempts"]) == ("pending", 0)
    # The attempt history stays.
    history = ok(await ann.get(f"/v1/runs/{dead['run_id']}"))["attempt_history"]
    assert [a["outcome"] for a in history] == ["retry"]


async def test_resume_an_interrupted_run(ann: httpx.AsyncClient, store: RunStore) -> None:
    first = await submit(ann, "t1", "one")
    error_of(
        await ann.post(f"/v1/runs/{first['run_id']}/resume", json={"value": 1}),
        409,
        "not_interrupted",
    )
    claimed = await claim_run(store, first["run_id"])
    await store.save_checkpoint(claimed.id, claimed.lease_token, {"turn": 2})
    await finish(store, claimed, Outcome.INTERRUPTED, interrupt={"ask": "approve?"})
    interrupted = ok(await ann.get(f"/v1/runs/{first['run_id']}"))
    assert (interrupted["status"], interrupted["interrupt"]) == ("interrupted", {"ask": "approve?"})

    resumed = ok(
        await ann.post(f"/v1/runs/{first['run_id']}/resume", json={"value": {"ok": True}}), 201
    )
    assert (resumed["kind"], resumed["resumed_from"], resumed["status"]) == (
        "resume",
        first["run_id"],
        "pending",
    )
    assert resumed["resume_value"] == {"ok": True}
    again = ok(
        await ann.post(f"/v1/runs/{first['run_id']}/resume", json={"value": {"ok": True}}), 200
    )
    assert again["run_id"] == resumed["run_id"]
    error_of(
        await ann.post(f"/v1/runs/{first['run_id']}/resume", json={"value": {"ok": False}}),
        409,
        "resume_superseded",
    )
    snapshot = ok(await ann.get("/v1/threads/t1/queue", params={"agent": AGENT}))
    assert (snapshot["state"], snapshot["run_id"]) == ("running", resumed["run_id"])


async def test_resume_an_interrupted_direct_run(ann: httpx.AsyncClient, store: RunStore) -> None:
    run = await direct_run(ann)
    await end_run(store, run["run_id"], Outcome.INTERRUPTED, interrupt={"ask": 1})
    resumed = ok(await ann.post(f"/v1/runs/{run['run_id']}/resume", json={"value": None}), 201)
    assert resumed["resumed_from"] == run["run_id"] and resumed["thread_id"] is None


# -- listing ----------------------------------------------------------------------


async def test_a_cursor_walks_every_run_exactly_once(ann: httpx.AsyncClient) -> None:
    made = [(await direct_run(ann, input={"i": i}))["run_id"] for i in range(7)]
    lane = await submit(ann, "t1", "one")
    made.append(lane["run_id"])

    seen: list[dict[str, Any]] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 3}
        if cursor:
            params["cursor"] = cursor
        page = ok(await ann.get("/v1/runs", params=params))
        assert len(page["items"]) <= 3
        seen.extend(page["items"])
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert pages < 10, "the cursor does not end"
    ids = [r["run_id"] for r in seen]
    assert len(ids) == len(set(ids)) == len(made)
    assert set(ids) == set(made)
    # Newest first, as the cursor's (created_at, id) order says.
    order = [(datetime.fromisoformat(r["created_at"]), UUID(r["run_id"]).bytes) for r in seen]
    assert order == sorted(order, reverse=True)
    assert pages == 3


async def test_list_limits_and_filters(ann: httpx.AsyncClient, store: RunStore) -> None:
    failed = await direct_run(ann, agent="writer")
    await end_run(store, failed["run_id"], Outcome.FAILED)
    for i in range(51):
        await direct_run(ann, input={"i": i})
    lane = await submit(ann, "t1", "x")

    default = ok(await ann.get("/v1/runs"))
    assert len(default["items"]) == 50 and default["next_cursor"]
    everything = ok(await ann.get("/v1/runs", params={"limit": 200}))
    assert len(everything["items"]) == 53 and everything["next_cursor"] is None
    assert len(ok(await ann.get("/v1/runs", params={"limit": 1}))["items"]) == 1

    by_status = ok(await ann.get("/v1/runs", params={"status": "failed"}))
    assert [r["run_id"] for r in by_status["items"]] == [failed["run_id"]]
    both = ok(await ann.get("/v1/runs", params=[("status", "failed"), ("status", "pending")]))
    assert len(both["items"]) == 50
    by_agent = ok(await ann.get("/v1/runs", params={"agent": "writer"}))
    assert [r["run_id"] for r in by_agent["items"]] == [failed["run_id"]]
    by_thread = ok(await ann.get("/v1/runs", params={"thread_id": "t1"}))
    assert [r["run_id"] for r in by_thread["items"]] == [lane["run_id"]]
    none = ok(await ann.get("/v1/runs", params={"thread_id": "nope"}))
    assert none == {"items": [], "next_cursor": None}


# -- worker identities are for admins ------------------------------------------------


async def test_worker_id_is_shown_to_admins_only(
    ann: httpx.AsyncClient, admin: httpx.AsyncClient, store: RunStore
) -> None:
    run = await direct_run(ann)
    await claim_run(store, run["run_id"], worker=WORKER)

    as_admin = ok(await admin.get(f"/v1/runs/{run['run_id']}"))
    assert as_admin["worker_id"] == WORKER
    assert [a["worker_id"] for a in as_admin["attempt_history"]] == [WORKER]
    listed = ok(await admin.get("/v1/runs"))["items"]
    assert [r["worker_id"] for r in listed] == [WORKER]

    as_owner = ok(await ann.get(f"/v1/runs/{run['run_id']}"))
    assert as_owner["worker_id"] is None
    assert [a["worker_id"] for a in as_owner["attempt_history"]] == [None]
    assert as_owner["attempt_history"][0]["attempt"] == 1
    assert [r["worker_id"] for r in ok(await ann.get("/v1/runs"))["items"]] == [None]
    cancelled = ok(await ann.post(f"/v1/runs/{run['run_id']}/cancel"))
    assert cancelled["status"] == "cancel_requested" and cancelled["worker_id"] is None
    assert ok(await admin.post(f"/v1/runs/{run['run_id']}/cancel"))["worker_id"] == WORKER
    assert WORKER not in (await ann.get(f"/v1/runs/{run['run_id']}")).text


# -- event streams (the basics; test_api_streams.py goes deep) -------------------------


async def test_event_streams_of_finished_runs_and_requests(
    ann: httpx.AsyncClient, store: RunStore
) -> None:
    request = await submit(ann, "t1", "one", request_id="one")
    claimed = await claim_run(store, request["run_id"])
    for i in range(3):
        assert await store.append_event(claimed.id, claimed.lease_token, "token", {"i": i})
    await finish(store, claimed, Outcome.COMPLETED, output={"answer": "hi"})

    events = await read_sse(ann, f"/v1/runs/{request['run_id']}/events")
    assert [(e.get("id"), e["event"]) for e in events] == [
        ("1", "token"),
        ("2", "token"),
        ("3", "token"),
        (None, "end"),
    ]
    assert [e["data"]["data"] for e in events[:3]] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert events[-1]["data"]["status"] == "completed"
    assert events[-1]["data"]["output"] == {"answer": "hi"}

    after = await read_sse(ann, f"/v1/runs/{request['run_id']}/events", params={"after_seq": 2})
    assert [e.get("id") for e in after] == ["3", None]
    resumed = await read_sse(
        ann, f"/v1/runs/{request['run_id']}/events", headers={"Last-Event-ID": "1"}
    )
    assert [e.get("id") for e in resumed] == ["2", "3", None]

    dispatched = await read_sse(ann, "/v1/requests/one/events")
    assert [e["event"] for e in dispatched] == ["dispatched"]
    assert dispatched[0]["data"] == {
        "request_id": "one",
        "status": "dispatched",
        "run_id": request["run_id"],
    }
    await submit(ann, "t2", "a")
    await submit(ann, "t2", "b", policy="reject", request_id="rej")
    rejected = await read_sse(ann, "/v1/requests/rej/events")
    assert [(e["event"], e["data"].get("reason")) for e in rejected] == [("rejected", "lane_busy")]


# -- metrics --------------------------------------------------------------------------


async def test_metrics_count_requests_and_lane_refusals(
    api: ApiServer, ann: httpx.AsyncClient, store: RunStore
) -> None:
    async def scrape() -> str:
        async with api.client() as client:
            response = await client.get("/metrics")
            assert response.status_code == 200
            return response.text

    before = await scrape()
    missing = f"/v1/runs/{uuid4()}"
    for _ in range(3):
        error_of(await ann.get(missing), 404, "not_found")
    first = await submit(ann, "t1", "one")
    await claim_run(store, first["run_id"])
    await submit(ann, "t1", "steer", policy="steer")
    for _ in range(2):
        error_of(
            await ann.post(
                "/v1/threads/t1/requests", json={"agent": AGENT, "policy": "steer", "input": 2}
            ),
            409,
            "steer_already_pending",
        )
    await submit(ann, "t1", "no", policy="reject", request_id="rej")
    # An idempotent replay of a rejection is not a new refusal.
    await submit(ann, "t1", "no", policy="reject", request_id="rej", status=200)
    after = await scrape()

    def delta(sample: str, **labels: str) -> float:
        return metric(after, sample, **labels) - metric(before, sample, **labels)

    requests_total = "runlane_api_requests_total"
    assert delta(requests_total, method="GET", route="/v1/runs/{run_id}", status="404") == 3
    route = "/v1/threads/{thread_id}/requests"
    assert delta(requests_total, method="POST", route=route, status="201") == 3
    assert delta(requests_total, method="POST", route=route, status="409") == 2
    assert delta(requests_total, method="POST", route=route, status="200") == 1
    assert delta(requests_total, method="GET", route="/metrics", status="200") == 1
    # Routes are labelled by template, never by raw path.
    assert missing not in after
    refusals = "runlane_lane_refusals_total"
    assert delta(refusals, code="steer_already_pending") == 2
    assert delta(refusals, code="lane_busy") == 1
    assert metric(after, "runlane_api_request_seconds_count", route="/v1/runs/{run_id}") >= 3
