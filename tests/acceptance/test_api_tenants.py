"""Tenant isolation over the HTTP API (issue 4): a matrix of callers by
every endpoint, through a real HTTP server.

The rules as implemented (src/runlane/api/):

- A key sees only its tenant: another tenant's run or request answers 404,
  never 403, so existence does not leak.
- Runs and requests: a non-admin key sees only its own user's; an admin key
  sees every user's of its tenant (and may act on them).
- Retry needs an admin key (403 first, for any id), then the run must be in
  the admin's tenant (404).
- Lanes are keyed by (tenant, user, agent, thread_id) from the key: a thread
  id names the caller's own lane, so nobody, admins included, reads or
  continues another user's lane; asking for it shows the caller's own lane
  (idle and empty when unused) rather than 404.
- A request_id is unique per tenant; an idempotency key per user.

``ann`` (acme) owns everything the tests create. The outsiders are ``bob``
(acme, another user), ``ann@globex`` (the same user id in another tenant)
and ``root`` (globex's admin); ``boss`` is acme's admin.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest

from runlane.models import Outcome
from runlane.settings import Settings
from runlane.store import RunStore
from tests.api_support import ApiServer, create_key, serve_api
from tests.integration.lane_helpers import finish

Conn = psycopg.Connection[Any]

AGENT = "bot"
WORKER = "worker-host-7.internal"


@dataclass
class World:
    """What ann owns, one object in each interesting state."""

    failed_run: str  # direct, failed (retry target)
    done_run: str  # direct, completed, with events
    running_run: str  # lane t1, running (request ann-1)
    interrupted_run: str  # lane t2, interrupted (request ann-3)
    pending_run: str  # direct, pending, idempotency key ann-idem
    requests: tuple[str, ...] = ("ann-1", "ann-2", "ann-3")

    @property
    def runs(self) -> list[str]:
        return [
            self.failed_run,
            self.done_run,
            self.running_run,
            self.interrupted_run,
            self.pending_run,
        ]


@dataclass
class Callers:
    ann: httpx.AsyncClient
    bob: httpx.AsyncClient
    boss: httpx.AsyncClient
    ann_at_globex: httpx.AsyncClient
    root: httpx.AsyncClient

    def outsiders(self) -> dict[str, httpx.AsyncClient]:
        return {"bob": self.bob, "ann@globex": self.ann_at_globex, "root": self.root}


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[ApiServer]:
    async with serve_api(settings) as server:
        yield server


@pytest.fixture
async def callers(api: ApiServer) -> AsyncIterator[Callers]:
    async def client(tenant: str, user: str, admin: bool = False) -> httpx.AsyncClient:
        return api.client(await create_key(api.context.keys, tenant, user, admin=admin))

    made = Callers(
        ann=await client("acme", "ann"),
        bob=await client("acme", "bob"),
        boss=await client("acme", "boss", admin=True),
        ann_at_globex=await client("globex", "ann"),
        root=await client("globex", "root", admin=True),
    )
    clients = [made.ann, made.bob, made.boss, made.ann_at_globex, made.root]
    try:
        yield made
    finally:
        for one in clients:
            await one.aclose()


async def claim(store: RunStore, run_id: str) -> Any:
    batch = await store.claim_batch(worker_id=WORKER, limit=1, lease_seconds=300)
    assert batch and str(batch[0].id) == run_id, "another run was claimable"
    return batch[0]


def body_of(response: httpx.Response, status: int) -> Any:
    assert response.status_code == status, (response.request.url, response.text)
    return response.json()


@pytest.fixture
async def world(callers: Callers, store: RunStore) -> World:
    ann = callers.ann

    async def run(**extra: Any) -> str:
        reply = body_of(await ann.post("/v1/runs", json={"agent": AGENT, **extra}), 201)
        return str(reply["run_id"])

    async def request(thread: str, request_id: str, text: str) -> dict[str, Any]:
        body = {"agent": AGENT, "input": {"text": text}, "request_id": request_id}
        reply: dict[str, Any] = body_of(
            await ann.post(f"/v1/threads/{thread}/requests", json=body), 201
        )
        return reply

    # One claimable run at a time, so that each claim takes the intended one.
    failed_run = await run(input={"secret": "failed"})
    await finish(store, await claim(store, failed_run), Outcome.FAILED, error={"code": "boom"})
    done_run = await run(input={"secret": "done"})
    claimed = await claim(store, done_run)
    for i in range(2):
        await store.append_event(claimed.id, claimed.lease_token, "token", {"i": i})
    await finish(store, claimed, Outcome.COMPLETED, output={"secret": "output"})
    first = await request("t1", "ann-1", "one")
    running_run = str(first["run_id"])
    await claim(store, running_run)
    assert (await request("t1", "ann-2", "two"))["status"] == "queued"
    third = await request("t2", "ann-3", "three")
    interrupted_run = str(third["run_id"])
    await finish(
        store, await claim(store, interrupted_run), Outcome.INTERRUPTED, interrupt={"ask": 1}
    )
    pending_run = await run(input={"secret": "pending"}, idempotency_key="ann-idem")
    return World(failed_run, done_run, running_run, interrupted_run, pending_run)


def snapshot(sql: Conn) -> dict[str, list[Any]]:
    """Every row ann's objects are made of."""
    mine = "SELECT id FROM runlane.runs WHERE tenant = 'acme' AND user_id = 'ann'"
    lanes = "SELECT id FROM runlane.lanes WHERE tenant = 'acme' AND user_id = 'ann'"
    queries = {
        "runs": f"SELECT to_jsonb(t) FROM runlane.runs t WHERE id IN ({mine}) ORDER BY id",
        "attempts": f"SELECT to_jsonb(t) FROM runlane.run_attempts t WHERE run_id IN ({mine})"
        " ORDER BY run_id, attempt",
        "events": f"SELECT to_jsonb(t) FROM runlane.run_events t WHERE run_id IN ({mine})"
        " ORDER BY run_id, seq",
        "lanes": f"SELECT to_jsonb(t) FROM runlane.lanes t WHERE id IN ({lanes}) ORDER BY id",
        "requests": f"SELECT to_jsonb(t) FROM runlane.requests t WHERE lane_id IN ({lanes})"
        " ORDER BY id",
    }
    return {name: [row[0] for row in sql.execute(query)] for name, query in queries.items()}


def not_found(response: httpx.Response, who: str) -> None:
    assert response.status_code == 404, (who, response.request.method, response.request.url)
    assert response.json()["error"]["code"] == "not_found", (who, response.text)


# -- outsiders: no read, no write ------------------------------------------------


async def test_outsiders_read_nothing_of_anothers(callers: Callers, world: World) -> None:
    for who, client in callers.outsiders().items():
        for run_id in world.runs:
            not_found(await client.get(f"/v1/runs/{run_id}"), who)
        not_found(await client.get(f"/v1/runs/{world.done_run}/events"), who)
        not_found(await client.get(f"/v1/runs/{world.done_run}/events?after_seq=0"), who)
        for request_id in world.requests:
            not_found(await client.get(f"/v1/requests/{request_id}"), who)
            not_found(await client.get(f"/v1/requests/{request_id}/events"), who)

        for params in ({}, {"thread_id": "t1"}, {"agent": AGENT}, {"status": "failed"}):
            page = body_of(await client.get("/v1/runs", params={**params, "limit": 200}), 200)
            assert page == {"items": [], "next_cursor": None}, (who, params)

        # The thread id names the caller's own lane: empty, nothing of ann's.
        for thread in ("t1", "t2"):
            lane = body_of(await client.get(f"/v1/threads/{thread}/queue?agent={AGENT}"), 200)
            assert lane == {
                "thread_id": thread,
                "agent": AGENT,
                "state": "idle",
                "paused_reason": None,
                "run_id": None,
                "queued": [],
            }, who


async def test_outsiders_change_nothing_of_anothers(
    callers: Callers, world: World, sql: Conn
) -> None:
    before = snapshot(sql)
    for who, client in callers.outsiders().items():
        not_found(await client.post(f"/v1/runs/{world.pending_run}/cancel"), who)
        not_found(await client.post(f"/v1/runs/{world.running_run}/cancel"), who)
        not_found(
            await client.post(f"/v1/runs/{world.interrupted_run}/resume", json={"value": 1}), who
        )
        for request_id in ("ann-2", "ann-1"):
            not_found(await client.post(f"/v1/requests/{request_id}/cancel"), who)
            not_found(await client.post(f"/v1/requests/{request_id}/steer"), who)
        # Continue acts on the caller's own (unused) lane.
        response = await client.post(f"/v1/threads/t1/queue/continue?agent={AGENT}")
        assert response.status_code == 409, (who, response.text)
        assert response.json()["error"]["code"] == "queue_not_paused", who
        # A submission into "the same" thread goes to the caller's own lane.
        mine = body_of(
            await client.post(
                "/v1/threads/t1/requests", json={"agent": AGENT, "input": {"from": who}}
            ),
            201,
        )
        assert mine["status"] == "dispatched" and mine["run_id"] not in world.runs, who

    # Retry: non-admins are refused before any lookup; another tenant's
    # admin does not find the run.
    for who, client in (("bob", callers.bob), ("ann@globex", callers.ann_at_globex)):
        response = await client.post(f"/v1/runs/{world.failed_run}/retry")
        assert response.status_code == 403, (who, response.text)
        assert response.json()["error"]["code"] == "forbidden"
    not_found(await callers.root.post(f"/v1/runs/{world.failed_run}/retry"), "root")

    assert snapshot(sql) == before
    # And ann still sees her lane as it was.
    lane = body_of(await callers.ann.get(f"/v1/threads/t1/queue?agent={AGENT}"), 200)
    assert (lane["state"], lane["run_id"]) == ("running", world.running_run)
    assert [r["request_id"] for r in lane["queued"]] == ["ann-2"]


async def test_request_ids_and_idempotency_keys_do_not_cross_tenants(
    callers: Callers, world: World, sql: Conn
) -> None:
    before = snapshot(sql)
    other = callers.ann_at_globex
    # The same request_id in another tenant is another request, even for
    # the same user id, thread and input.
    body = {"agent": AGENT, "input": {"text": "two"}, "request_id": "ann-2"}
    theirs = body_of(await other.post("/v1/threads/t1/requests", json=body), 201)
    assert theirs["status"] == "dispatched"
    # The same idempotency key in another tenant is another run.
    run = body_of(
        await other.post(
            "/v1/runs", json={"agent": AGENT, "input": {}, "idempotency_key": "ann-idem"}
        ),
        201,
    )
    assert run["run_id"] != world.pending_run and run["input"] == {}
    # Within the tenant a request_id is taken once: bob learns that the id
    # is in use, but nothing of the request.
    response = await callers.bob.post(
        "/v1/threads/t1/requests",
        json={"agent": AGENT, "input": {"text": "two"}, "request_id": "ann-2"},
    )
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "request_id_conflict"
    assert "two" not in response.json()["error"]["message"]
    assert snapshot(sql) == before


async def test_an_idempotency_key_does_not_reveal_another_users_run(
    callers: Callers, world: World
) -> None:
    # Idempotency keys are per user: bob's use of ann's key is bob's own run.
    body = {"agent": AGENT, "input": {"from": "bob"}, "idempotency_key": "ann-idem"}
    bobs = body_of(await callers.bob.post("/v1/runs", json=body), 201)
    assert bobs["run_id"] != world.pending_run and bobs["input"] == {"from": "bob"}
    assert body_of(await callers.bob.post("/v1/runs", json=body), 200)["run_id"] == bobs["run_id"]
    not_found(await callers.bob.get(f"/v1/runs/{world.pending_run}"), "bob")
    # ann's replay still finds hers.
    mine = {"agent": AGENT, "input": {"secret": "pending"}, "idempotency_key": "ann-idem"}
    replay = body_of(await callers.ann.post("/v1/runs", json=mine), 200)
    assert replay["run_id"] == world.pending_run


# -- the owner and the tenant's admin -----------------------------------------------


async def test_the_owner_sees_her_own_and_nobody_elses(callers: Callers, world: World) -> None:
    ann = callers.ann
    listed = body_of(await ann.get("/v1/runs", params={"limit": 200}), 200)["items"]
    assert {r["run_id"] for r in listed} == set(world.runs)
    for run_id in world.runs:
        assert body_of(await ann.get(f"/v1/runs/{run_id}"), 200)["worker_id"] is None
    for request_id in world.requests:
        body_of(await ann.get(f"/v1/requests/{request_id}"), 200)

    bobs = body_of(await callers.bob.post("/v1/runs", json={"agent": AGENT}), 201)
    bobs_request = body_of(
        await callers.bob.post(
            "/v1/threads/t9/requests", json={"agent": AGENT, "request_id": "bob-1"}
        ),
        201,
    )
    not_found(await ann.get(f"/v1/runs/{bobs['run_id']}"), "ann")
    not_found(await ann.get(f"/v1/runs/{bobs_request['run_id']}"), "ann")
    not_found(await ann.get("/v1/requests/bob-1"), "ann")
    not_found(await ann.post("/v1/requests/bob-1/cancel"), "ann")
    assert bobs["run_id"] not in {
        r["run_id"] for r in body_of(await ann.get("/v1/runs?limit=200"), 200)["items"]
    }
    bob_listed = body_of(await callers.bob.get("/v1/runs?limit=200"), 200)["items"]
    assert {r["run_id"] for r in bob_listed} == {bobs["run_id"], bobs_request["run_id"]}


async def test_the_tenants_admin_sees_and_acts_on_every_users_runs_and_requests(
    callers: Callers, world: World
) -> None:
    boss = callers.boss
    listed = body_of(await boss.get("/v1/runs", params={"limit": 200}), 200)["items"]
    assert set(world.runs) <= {r["run_id"] for r in listed}
    running = body_of(await boss.get(f"/v1/runs/{world.running_run}"), 200)
    assert running["worker_id"] == WORKER
    done = body_of(await boss.get(f"/v1/runs/{world.done_run}"), 200)
    assert done["output"] == {"secret": "output"}
    async with boss.stream("GET", f"/v1/runs/{world.done_run}/events") as stream:
        assert stream.status_code == 200
        text = (await stream.aread()).decode()
    assert "event: end" in text
    for request_id in world.requests:
        assert body_of(await boss.get(f"/v1/requests/{request_id}"), 200)["request_id"] == (
            request_id
        )

    # Lanes stay per user: the admin's t1 is the admin's own, empty lane.
    lane = body_of(await boss.get(f"/v1/threads/t1/queue?agent={AGENT}"), 200)
    assert (lane["state"], lane["queued"]) == ("idle", [])

    # The admin may act on ann's objects.
    assert body_of(await boss.post("/v1/requests/ann-2/steer"), 200)["steer"] is True
    assert body_of(await boss.post("/v1/requests/ann-2/cancel"), 409)["error"]["code"] == (
        "steer_in_progress"
    )
    resumed = body_of(
        await boss.post(f"/v1/runs/{world.interrupted_run}/resume", json={"value": "ok"}), 201
    )
    assert resumed["resumed_from"] == world.interrupted_run
    retried = body_of(await boss.post(f"/v1/runs/{world.failed_run}/retry"), 200)
    assert retried["status"] == "pending"
    cancelled = body_of(await boss.post(f"/v1/runs/{world.pending_run}/cancel"), 200)
    assert cancelled["status"] == "cancelled"
    # What the admin did shows up for ann; the resume run is hers.
    assert body_of(await callers.ann.get(f"/v1/runs/{resumed['run_id']}"), 200)["kind"] == (
        "resume"
    )


async def test_another_tenants_admin_sees_nothing(callers: Callers, world: World) -> None:
    root = callers.root
    for run_id in world.runs:
        not_found(await root.get(f"/v1/runs/{run_id}"), "root")
        not_found(await root.post(f"/v1/runs/{run_id}/retry"), "root")
    for request_id in world.requests:
        not_found(await root.get(f"/v1/requests/{request_id}"), "root")
    assert body_of(await root.get("/v1/runs?limit=200"), 200)["items"] == []
    # A 404 for an existing run reads exactly like one for a missing run.
    missing = await root.get("/v1/runs/00000000-0000-0000-0000-000000000000")
    existing = await root.get(f"/v1/runs/{world.pending_run}")
    assert missing.json()["error"]["code"] == existing.json()["error"]["code"] == "not_found"
    assert existing.json()["error"]["message"] == f"no run {world.pending_run}"
