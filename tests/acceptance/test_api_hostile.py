"""Hostile input through the real HTTP API (issue 7, fault 7): oversized
bodies, deep JSON nesting, invalid UTF-8, SQL-injection strings and control
characters in every string field, query and path parameter, huge limits,
bad cursors, wrong content types, forged or revoked keys, and another
tenant's or user's ids.

Every such request must answer 4xx with an error code (``{"error": {"code",
"message"}}``), never 5xx, and leave the stored data exactly as it was: a
checksum of every runlane table is compared before and after.

Strings that are legal *data* (a run's input and metadata, an idempotency
key) are a different matter: hostile text there is stored verbatim and
read back unchanged, and changes nothing else.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest

from runlane.api.errors import STATUS_BY_CODE
from runlane.models import Outcome
from runlane.settings import Settings
from runlane.store import RunStore
from tests.api_support import ApiServer, create_key, serve_api
from tests.integration.lane_helpers import finish

Conn = psycopg.Connection[Any]

AGENT = "bot"
MAX_BODY = 64 * 1024
MAX_INPUT = 32 * 1024

# Injection strings and control characters, tried in every string field.
HOSTILE = [
    "' OR '1'='1",
    "'; DROP TABLE runlane.runs; --",
    '") OR 1=1 --',
    "1; SELECT pg_sleep(5)",
    "$$; DELETE FROM runlane.requests; $$",
    "%",
    "_",
    "\\",
    "\x00",
    "a\x00b",
    "\x01\x02\x1b[31m\x7f",
    "\r\nX-Injected: 1",
    "\t",
    "\u2028\u2029",
    "\ufeff",
    "\ud800",
    "../../etc/passwd",
    "<script>alert(1)</script>",
    "${jndi:ldap://x/a}",
    "😀",
    " leading-space",
    "a" * 300,
]
# Those PostgreSQL cannot store in text or jsonb: refused even where any
# other string is legal data.
UNSTORABLE = [h for h in HOSTILE if "\x00" in h or "\ud800" in h]
STORABLE = [h for h in HOSTILE if h not in UNSTORABLE]


def path_part(value: str) -> str:
    """``value`` percent-encoded for a path segment (a lone surrogate as the
    invalid UTF-8 bytes it would be)."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


def deep_json(depth: int, *, objects: bool = False) -> str:
    if objects:
        return '{"a":' * depth + "1" + "}" * depth
    return "[" * depth + "]" * depth


TABLES = """
SELECT table_name FROM information_schema.tables
WHERE table_schema = 'runlane' AND table_type = 'BASE TABLE' ORDER BY 1
"""


def checksum(sql: Conn) -> dict[str, str]:
    """Row count and md5 of every runlane table (api_keys.last_used_at,
    touched by authentication, left out)."""
    sums = {}
    for (table,) in sql.execute(TABLES).fetchall():
        row = sql.execute(
            "SELECT count(*) || ':' || coalesce(md5(string_agg(j, '|' ORDER BY j)), '')"
            f" FROM (SELECT (to_jsonb(t) - 'last_used_at')::text AS j FROM runlane.{table} AS t)"
            " AS s"
        ).fetchone()
        assert row is not None
        sums[table] = row[0]
    return sums


@dataclass
class World:
    """ann (acme) owns everything; the others try to reach it."""

    done_run: str  # direct, completed, with events
    pending_run: str  # direct, pending
    lane_run: str  # thread t-ann, running
    requests: list[str]  # ann-1 (dispatched), ann-2, ann-3 (queued)
    keys: dict[str, str] = field(default_factory=dict)


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[ApiServer]:
    limited = settings.model_copy(update={"max_body_bytes": MAX_BODY, "max_input_bytes": MAX_INPUT})
    async with serve_api(limited) as server:
        yield server


@pytest.fixture
async def world(api: ApiServer, store: RunStore) -> World:
    keys = api.context.keys
    names = {
        "ann": ("acme", "ann", False),
        "carl": ("acme", "carl", False),  # same tenant, another user
        "boss": ("acme", "boss", True),  # acme's admin
        "bob": ("globex", "bob", False),  # another tenant
        "root": ("globex", "root", True),  # another tenant's admin
        "revoked": ("acme", "ann", False),
    }
    secrets = {
        name: await create_key(keys, *spec[:2], admin=spec[2]) for name, spec in names.items()
    }
    await keys.revoke(secrets["revoked"][: secrets["revoked"].index("_", 3)])

    async with api.client(secrets["ann"]) as ann:
        done = (await ann.post("/v1/runs", json={"agent": AGENT, "input": {"n": 1}})).json()
        claimed = await store.claim_batch(worker_id="w", limit=1, lease_seconds=600)
        assert [c.id for c in claimed] == [done["run_id"]] or str(claimed[0].id) == str(
            done["run_id"]
        )
        for n in range(3):
            await store.append_event(claimed[0].id, claimed[0].lease_token, "step", {"n": n})
        await store.record_effect(claimed[0].id, claimed[0].lease_token, "mail", {"ok": 1})
        await finish(store, claimed[0], Outcome.COMPLETED, output={"answer": 42})

        requests = []
        for n in (1, 2, 3):
            reply = await ann.post(
                "/v1/threads/t-ann/requests",
                json={"agent": AGENT, "input": {"text": f"m{n}"}, "request_id": f"ann-{n}"},
            )
            assert reply.status_code == 201, reply.text
            requests.append(reply.json())
        lane_claim = await store.claim_batch(worker_id="w", limit=1, lease_seconds=600)
        assert str(lane_claim[0].id) == requests[0]["run_id"]

        pending = (await ann.post("/v1/runs", json={"agent": AGENT, "input": {"n": 2}})).json()
    async with api.client(secrets["bob"]) as bob:
        assert (await bob.post("/v1/runs", json={"agent": AGENT})).status_code == 201
        reply = await bob.post(
            "/v1/threads/t-bob/requests", json={"agent": AGENT, "request_id": "bob-1"}
        )
        assert reply.status_code == 201
    # Every key is used once, so that authentication writes nothing later.
    for secret in secrets.values():
        async with api.client(secret) as client:
            await client.get("/v1/runs")
    return World(
        done_run=done["run_id"],
        pending_run=pending["run_id"],
        lane_run=requests[0]["run_id"],
        requests=[r["request_id"] for r in requests],
        keys=secrets,
    )


@dataclass
class Case:
    label: str
    method: str
    url: str
    key: str | None = "ann"
    kwargs: dict[str, Any] = field(default_factory=dict)
    # A list filter that matches nothing may answer 200 with no items.
    empty_list_ok: bool = False


def body(value: Any) -> dict[str, Any]:
    """A JSON body, ASCII-escaped (a lone surrogate travels as \\ud800)."""
    return raw(json.dumps(value).encode())


def raw(content: bytes, content_type: str | None = "application/json") -> dict[str, Any]:
    headers = {"content-type": content_type} if content_type else {}
    return {"content": content, "headers": headers}


def string_cases(world: World) -> list[Case]:
    """Every hostile string in every identifier field, query and path
    parameter (and, where it cannot be stored, in the data fields)."""
    cases = []
    run_id = world.pending_run
    # Event streams are asked of a finished run: were one to be accepted,
    # it would end at once rather than stream.
    done = world.done_run
    for h in HOSTILE:
        p = path_part(h)
        cases += [
            Case(f"run agent {h!r}", "POST", "/v1/runs", kwargs=body({"agent": h})),
            Case(f"run extra field {h!r}", "POST", "/v1/runs", kwargs=body({"agent": AGENT, h: 1})),
            Case(
                f"submit thread {h!r}",
                "POST",
                f"/v1/threads/{p}/requests",
                kwargs=body({"agent": AGENT}),
            ),
            Case(
                f"submit agent {h!r}",
                "POST",
                "/v1/threads/t-ann/requests",
                kwargs=body({"agent": h}),
            ),
            Case(
                f"submit request_id {h!r}",
                "POST",
                "/v1/threads/t-ann/requests",
                kwargs=body({"agent": AGENT, "request_id": h}),
            ),
            Case(
                f"submit policy {h!r}",
                "POST",
                "/v1/threads/t-ann/requests",
                kwargs=body({"agent": AGENT, "policy": h}),
            ),
            Case(f"queue thread {h!r}", "GET", f"/v1/threads/{p}/queue?agent={AGENT}"),
            Case(f"queue agent {h!r}", "GET", f"/v1/threads/t-ann/queue?agent={p}"),
            Case(f"continue thread {h!r}", "POST", f"/v1/threads/{p}/queue/continue?agent={AGENT}"),
            Case(f"continue agent {h!r}", "POST", f"/v1/threads/t-ann/queue/continue?agent={p}"),
            Case(f"get request {h!r}", "GET", f"/v1/requests/{p}"),
            Case(f"cancel request {h!r}", "POST", f"/v1/requests/{p}/cancel"),
            Case(f"steer request {h!r}", "POST", f"/v1/requests/{p}/steer"),
            Case(f"request events {h!r}", "GET", f"/v1/requests/{p}/events"),
            Case(f"get run {h!r}", "GET", f"/v1/runs/{p}"),
            Case(f"cancel run {h!r}", "POST", f"/v1/runs/{p}/cancel"),
            Case(f"resume run {h!r}", "POST", f"/v1/runs/{p}/resume", kwargs=body({"value": 1})),
            Case(f"retry run {h!r}", "POST", f"/v1/runs/{p}/retry", key="boss"),
            Case(f"run events {h!r}", "GET", f"/v1/runs/{p}/events"),
            Case(f"list status {h!r}", "GET", f"/v1/runs?status={p}"),
            Case(f"list cursor {h!r}", "GET", f"/v1/runs?cursor={p}"),
            Case(f"list limit {h!r}", "GET", f"/v1/runs?limit={p}"),
            Case(f"events after_seq {h!r}", "GET", f"/v1/runs/{done}/events?after_seq={p}"),
            # Filters: any string may be asked for; it must match nothing.
            Case(f"list agent {h!r}", "GET", f"/v1/runs?agent={p}"),
            Case(f"list thread {h!r}", "GET", f"/v1/runs?thread_id={p}"),
        ]
        if h == h.strip() and all(ord(c) < 128 and c.isprintable() for c in h):
            # (httpx sends only printable ASCII header values, unpadded.)
            cases.append(
                Case(
                    f"events Last-Event-ID {h!r}",
                    "GET",
                    f"/v1/runs/{done}/events",
                    kwargs={"headers": {"last-event-id": h}},
                )
            )
    for h in UNSTORABLE:
        cases += [
            Case(
                f"run idempotency_key {h!r}",
                "POST",
                "/v1/runs",
                kwargs=body({"agent": AGENT, "idempotency_key": h}),
            ),
            Case(
                f"run input {h!r}",
                "POST",
                "/v1/runs",
                kwargs=body({"agent": AGENT, "input": {h: h}}),
            ),
            Case(
                f"run metadata {h!r}",
                "POST",
                "/v1/runs",
                kwargs=body({"agent": AGENT, "metadata": {"k": h}}),
            ),
            Case(
                f"submit input {h!r}",
                "POST",
                "/v1/threads/t-new/requests",
                kwargs=body({"agent": AGENT, "input": [h]}),
            ),
            Case(
                f"submit metadata {h!r}",
                "POST",
                "/v1/threads/t-new/requests",
                kwargs=body({"agent": AGENT, "metadata": {h: 1}}),
            ),
            Case(
                f"resume value {h!r}",
                "POST",
                f"/v1/runs/{run_id}/resume",
                kwargs=body({"value": {"answer": h}}),
            ),
        ]
    return cases


def shape_cases(world: World) -> list[Case]:
    """Oversized and malformed bodies, deep nesting, invalid UTF-8, limits,
    cursors and content types."""
    run_id = world.pending_run
    big = b'{"agent": "bot", "input": "' + b"x" * MAX_BODY + b'"}'

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY // 1000 + 10):
            yield b"x" * 1000

    cases = [
        # Oversized: by Content-Length, streamed (chunked), and inputs over
        # the input cap inside an acceptable body.
        Case("run body over the cap", "POST", "/v1/runs", kwargs=raw(big)),
        Case("submit body over the cap", "POST", "/v1/threads/t-ann/requests", kwargs=raw(big)),
        Case("resume body over the cap", "POST", f"/v1/runs/{run_id}/resume", kwargs=raw(big)),
        Case(
            "cancel with a body over the cap", "POST", f"/v1/runs/{run_id}/cancel", kwargs=raw(big)
        ),
        Case(
            "run input over the input cap",
            "POST",
            "/v1/runs",
            kwargs=body({"agent": AGENT, "input": "x" * (MAX_INPUT + 1)}),
        ),
        Case(
            "submit input over the input cap",
            "POST",
            "/v1/threads/t-ann/requests",
            kwargs=body({"agent": AGENT, "input": ["x" * (MAX_INPUT + 1)]}),
        ),
        Case(
            "resume value over the input cap",
            "POST",
            f"/v1/runs/{run_id}/resume",
            kwargs=body({"value": "x" * (MAX_INPUT + 1)}),
        ),
        # Deep nesting: 10,000 levels (well within the body cap).
        *[
            Case(
                f"{where} nested 10,000 {'objects' if objects else 'arrays'} deep",
                "POST",
                path,
                kwargs=raw(template.replace("DEEP", deep_json(10_000, objects=objects)).encode()),
            )
            for objects in (False, True)
            for where, path, template in (
                ("run input", "/v1/runs", '{"agent": "bot", "input": DEEP}'),
                ("run metadata", "/v1/runs", '{"agent": "bot", "metadata": {"a": DEEP}}'),
                ("submit input", "/v1/threads/t-new/requests", '{"agent": "bot", "input": DEEP}'),
                ("resume value", f"/v1/runs/{run_id}/resume", '{"value": DEEP}'),
            )
        ],
        # Invalid UTF-8: in a JSON string, as the whole body, in paths and queries.
        Case(
            "run input invalid UTF-8",
            "POST",
            "/v1/runs",
            kwargs=raw(b'{"agent":"bot","input":"\xff\xfe"}'),
        ),
        Case("run agent invalid UTF-8", "POST", "/v1/runs", kwargs=raw(b'{"agent":"b\xc3\x28"}')),
        Case(
            "submit request_id invalid UTF-8",
            "POST",
            "/v1/threads/t-ann/requests",
            kwargs=raw(b'{"agent":"bot","request_id":"\xed\xa0\x80"}'),
        ),
        Case("body of invalid UTF-8", "POST", "/v1/runs", kwargs=raw(b"\xff\xfe\xfd")),
        Case("run path invalid UTF-8", "GET", "/v1/runs/%FF%FE"),
        Case("request path invalid UTF-8", "GET", "/v1/requests/%C3%28"),
        Case("thread path invalid UTF-8", "GET", f"/v1/threads/%FF/queue?agent={AGENT}"),
        Case("queue agent invalid UTF-8", "GET", "/v1/threads/t-ann/queue?agent=%FF"),
        Case("list agent invalid UTF-8", "GET", "/v1/runs?agent=%FF"),
        Case("list cursor invalid UTF-8", "GET", "/v1/runs?cursor=%FF%FE"),
        # Limits.
        *[
            Case(f"list limit {value}", "GET", f"/v1/runs?limit={value}")
            for value in ("99999999999999999999999999", "201", "0", "-1", "1e3", "1.5", "NaN", "")
        ],
        Case("events after_seq -1", "GET", f"/v1/runs/{world.done_run}/events?after_seq=-1"),
        Case("events after_seq NaN", "GET", f"/v1/runs/{world.done_run}/events?after_seq=NaN"),
        Case(
            "events Last-Event-ID too long",
            "GET",
            f"/v1/runs/{world.done_run}/events",
            kwargs={"headers": {"last-event-id": "9" * 41}},
        ),
        # Bad cursors.
        *[
            Case(f"list cursor {label}", "GET", f"/v1/runs?cursor={quote(cursor, safe='')}")
            for label, cursor in (
                ("not base64", "!!!"),
                ("of garbage", base64.urlsafe_b64encode(b"x").decode()),
                ("without a uuid", base64.urlsafe_b64encode(b"2024-01-01T00:00:00|nope").decode()),
                ("without a date", base64.urlsafe_b64encode(b"yesterday|" + b"0" * 32).decode()),
                ("of invalid UTF-8", base64.urlsafe_b64encode(b"\xff\xfe|\xfd").decode()),
                ("too long", "A" * 10_000),
                ("empty parts", base64.urlsafe_b64encode(b"|").decode()),
            )
        ],
        # Wrong content types and shapes.
        Case("run as text/plain", "POST", "/v1/runs", kwargs=raw(b"agent=bot", "text/plain")),
        Case(
            "run as XML", "POST", "/v1/runs", kwargs=raw(b"<run agent='bot'/>", "application/xml")
        ),
        Case("run as a form", "POST", "/v1/runs", kwargs={"data": {"agent": AGENT}}),
        Case(
            "run as multipart",
            "POST",
            "/v1/runs",
            kwargs={"files": {"agent": ("a.txt", b"bot", "text/plain")}},
        ),
        Case("run without a body", "POST", "/v1/runs"),
        Case("run with an empty JSON body", "POST", "/v1/runs", kwargs=raw(b"")),
        Case("run with a JSON array", "POST", "/v1/runs", kwargs=body([{"agent": AGENT}])),
        Case("run with JSON null", "POST", "/v1/runs", kwargs=raw(b"null")),
        Case("run with truncated JSON", "POST", "/v1/runs", kwargs=raw(b'{"agent": "bot"')),
        Case("run with NaN input", "POST", "/v1/runs", kwargs=raw(b'{"agent":"bot","input":NaN}')),
        Case(
            "run with 1e400 input", "POST", "/v1/runs", kwargs=raw(b'{"agent":"bot","input":1e400}')
        ),
        Case(
            "run with a 5,000-digit input",
            "POST",
            "/v1/runs",
            kwargs=raw(b'{"agent":"bot","input":1' + b"0" * 5000 + b"}"),
        ),
        Case(
            "submit as text/plain",
            "POST",
            "/v1/threads/t-ann/requests",
            kwargs=raw(b"hi", "text/plain"),
        ),
        Case("resume without a body", "POST", f"/v1/runs/{run_id}/resume"),
        # Numbers out of range and of the wrong type.
        *[
            Case(
                f"run {name} {value!r}",
                "POST",
                "/v1/runs",
                kwargs=body({"agent": AGENT, name: value}),
            )
            for name, value in (
                ("priority", 10**30),
                ("priority", "5"),
                ("priority", True),
                ("priority", 1.5),
                ("max_attempts", 0),
                ("max_attempts", 10**6),
                ("delay_seconds", -1),
                ("delay_seconds", 10**12),
                ("budget", {"max_seconds": -1}),
                ("budget", {"max_turns": 0}),
                ("budget", {"unknown": 1}),
                ("metadata", [1, 2]),
                ("metadata", "text"),
            )
        ],
        # Methods and routes that do not exist.
        Case("DELETE a run", "DELETE", f"/v1/runs/{run_id}"),
        Case("PUT the runs", "PUT", "/v1/runs", kwargs=body({"agent": AGENT})),
        Case("an unknown route", "GET", "/v1/runs/x/y/z"),
        Case("a path that climbs", "GET", "/v1/threads/..%2F..%2Fetc/queue?agent=bot"),
        Case("a very long path", "GET", "/v1/runs/" + "a" * 20_000),
    ]
    return cases


def key_cases(world: World) -> list[Case]:
    """Missing, forged and revoked keys; other tenants and users; roles."""
    ann_secret = world.keys["ann"]
    forged = [
        ("no header", None),
        ("Basic scheme", "Basic YW5uOnB3"),
        ("empty bearer", "Bearer"),
        ("garbage", "Bearer garbage"),
        ("prefix only", "Bearer rl_"),
        ("right prefix, wrong secret", "Bearer " + ann_secret[:-4] + "AAAA"),
        ("key in upper case", "Bearer " + ann_secret.upper()),
        ("key with a suffix", "Bearer " + ann_secret + "x"),
        ("injection", "Bearer rl_' OR '1'='1"),
        ("10 KB key", "Bearer rl_" + "a" * 10_000),
        ("revoked", "Bearer " + world.keys["revoked"]),
    ]
    paths = [
        ("GET", "/v1/runs", {}),
        ("POST", "/v1/runs", body({"agent": AGENT})),
        ("GET", f"/v1/runs/{world.done_run}", {}),
        ("POST", f"/v1/runs/{world.pending_run}/cancel", {}),
        ("POST", "/v1/threads/t-ann/requests", body({"agent": AGENT})),
        ("POST", f"/v1/requests/{world.requests[1]}/cancel", {}),
        ("GET", "/v1/admin/overview", {}),
    ]
    cases = []
    for label, header in forged:
        for method, path, kwargs in paths:
            headers = {"authorization": header} if header else {}
            cases.append(
                Case(
                    f"{label}: {method} {path}",
                    method,
                    path,
                    key=None,
                    kwargs={**kwargs, "headers": headers},
                )
            )

    # Another tenant (and its admin), and another user of the same tenant.
    for who in ("bob", "root", "carl"):
        for run_id in (world.done_run, world.pending_run, world.lane_run):
            cases += [
                Case(f"{who}: get {run_id}", "GET", f"/v1/runs/{run_id}", key=who),
                Case(f"{who}: cancel {run_id}", "POST", f"/v1/runs/{run_id}/cancel", key=who),
                Case(
                    f"{who}: resume {run_id}",
                    "POST",
                    f"/v1/runs/{run_id}/resume",
                    key=who,
                    kwargs=body({"value": 1}),
                ),
                Case(f"{who}: events {run_id}", "GET", f"/v1/runs/{run_id}/events", key=who),
                Case(f"{who}: retry {run_id}", "POST", f"/v1/runs/{run_id}/retry", key=who),
            ]
        for request_id in world.requests:
            cases += [
                Case(f"{who}: get {request_id}", "GET", f"/v1/requests/{request_id}", key=who),
                Case(
                    f"{who}: cancel {request_id}",
                    "POST",
                    f"/v1/requests/{request_id}/cancel",
                    key=who,
                ),
                Case(
                    f"{who}: steer {request_id}",
                    "POST",
                    f"/v1/requests/{request_id}/steer",
                    key=who,
                ),
                Case(
                    f"{who}: events {request_id}",
                    "GET",
                    f"/v1/requests/{request_id}/events",
                    key=who,
                ),
            ]
        # Their own (empty) lane of the same thread id: nothing to continue.
        cases.append(
            Case(
                f"{who}: continue t-ann",
                "POST",
                f"/v1/threads/t-ann/queue/continue?agent={AGENT}",
                key=who,
            )
        )
        cases.append(
            Case(
                f"{who}: ann's runs by thread",
                "GET",
                "/v1/runs?thread_id=t-ann",
                key=who,
                empty_list_ok=True,
            )
        )
    # Roles: a non-admin key on admin routes.
    cases += [
        Case("ann: admin overview", "GET", "/v1/admin/overview"),
        Case("ann: admin workers", "GET", "/v1/admin/workers"),
        Case("ann: admin tenant", "GET", "/v1/admin/tenant"),
        Case("ann: retry", "POST", f"/v1/runs/{world.done_run}/retry"),
    ]
    return cases


async def answer(clients: dict[str | None, httpx.AsyncClient], case: Case) -> str | None:
    """None when the answer is a proper refusal; otherwise what was wrong."""
    try:
        response = await clients[case.key].request(case.method, case.url, **case.kwargs)
    except httpx.HTTPError as exc:
        return f"no answer: {exc!r}"
    status = response.status_code
    if case.empty_list_ok and status == 200:
        items = response.json().get("items")
        return None if items == [] else f"200 with items {items!r}"[:300]
    if not 400 <= status < 500:
        return f"{status}: {response.text[:200]}"
    try:
        error = response.json()["error"]
        code = error["code"]
        assert isinstance(error["message"], str) and error["message"]
    except Exception:
        return f"{status} without an error code: {response.text[:200]}"
    if STATUS_BY_CODE.get(code) not in (None, status):
        return f"{status} with code {code!r}, documented as {STATUS_BY_CODE[code]}"
    return None


async def test_hostile_requests_are_refused_with_a_code_and_change_nothing(
    api: ApiServer, world: World, sql: Conn
) -> None:
    cases = string_cases(world) + shape_cases(world) + key_cases(world)
    before = checksum(sql)
    wrong = {}
    async with contextlib.AsyncExitStack() as stack:
        clients: dict[str | None, httpx.AsyncClient] = {
            name: await stack.enter_async_context(api.client(secret))
            for name, secret in world.keys.items()
        }
        clients[None] = await stack.enter_async_context(api.client())
        for case in cases:
            problem = await answer(clients, case)
            if problem is not None:
                wrong[case.label] = problem
    after = checksum(sql)
    assert wrong == {}, f"{len(wrong)} of {len(cases)} hostile requests were not refused properly"
    assert after == before, "a refused request changed stored data"
    assert len(cases) > 800


async def test_hostile_strings_in_data_fields_are_stored_verbatim(
    api: ApiServer, world: World, sql: Conn
) -> None:
    """Input, metadata and idempotency keys are data: hostile text is stored
    as sent, read back unchanged, and touches nothing else."""
    existing = checksum(sql)
    created_runs: list[str] = []
    async with api.client(world.keys["ann"]) as ann:
        for n, h in enumerate(STORABLE):
            sent = {
                "agent": AGENT,
                "input": {"text": h, h: [h]},
                "metadata": {h: h},
                "idempotency_key": f"{n}:{h}"[:200],
            }
            reply = await ann.post("/v1/runs", json=sent)
            assert reply.status_code == 201, (h, reply.text)
            run = reply.json()
            created_runs.append(run["run_id"])
            again = await ann.post("/v1/runs", json=sent)
            assert again.status_code == 200 and again.json()["run_id"] == run["run_id"], h
            read = (await ann.get(f"/v1/runs/{run['run_id']}")).json()
            assert read["input"] == sent["input"] and read["metadata"] == sent["metadata"], h

            request_id = f"hostile-{n}"
            reply = await ann.post(
                "/v1/threads/t-data/requests",
                json={"agent": AGENT, "input": [h], "metadata": {"m": h}, "request_id": request_id},
            )
            assert reply.status_code == 201, (h, reply.text)
            read = (await ann.get(f"/v1/requests/{request_id}")).json()
            assert read["input"] == [h], h
        listed = (await ann.get("/v1/runs", params={"limit": 200})).json()["items"]
        assert {r["run_id"] for r in listed} >= set(created_runs)

    # The rows that existed before are untouched, and nothing was dropped.
    after = checksum(sql)
    assert all(int(after[t].split(":")[0]) >= int(existing[t].split(":")[0]) for t in existing)
    unchanged = sql.execute(
        "SELECT count(*) FROM runlane.runs"
        " WHERE id = ANY(%s) AND status IN ('completed', 'pending', 'running')",
        ([world.done_run, world.pending_run, world.lane_run],),
    ).fetchone()
    assert unchanged == (3,)
    assert sql.execute("SELECT count(*) FROM runlane.run_events").fetchone() == (3,)
    assert sql.execute(
        "SELECT count(*) FROM runlane.requests WHERE status = 'queued' AND request_id LIKE 'ann-%'"
    ).fetchone() == (2,)


@pytest.mark.parametrize("where", ["run input", "run metadata", "submit input"])
async def test_moderately_deep_nesting_is_refused_not_stored(
    api: ApiServer, world: World, sql: Conn, where: str
) -> None:
    path, template = {
        "run input": ("/v1/runs", '{"agent": "bot", "input": DEEP}'),
        "run metadata": ("/v1/runs", '{"agent": "bot", "metadata": {"a": DEEP}}'),
        "submit input": ("/v1/threads/t-deep/requests", '{"agent": "bot", "input": DEEP}'),
    }[where]
    before = checksum(sql)
    async with api.client(world.keys["ann"]) as ann:
        reply = await ann.post(
            path,
            content=template.replace("DEEP", deep_json(300)).encode(),
            headers={"content-type": "application/json"},
        )
        listing = await ann.get("/v1/runs")
    assert reply.status_code == 422, reply.status_code
    assert reply.json()["error"]["code"] == "validation_error"
    assert "nested more than 100 levels" in reply.json()["error"]["message"]
    assert listing.status_code == 200
    assert checksum(sql) == before
