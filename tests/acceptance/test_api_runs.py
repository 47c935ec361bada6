"""Run resources over HTTP: what a run says about where it came from."""

from __future__ import annotations

from uuid import UUID

from runlane.keys import KeyStore
from runlane.models import Outcome
from runlane.settings import Settings
from runlane.store import RunStore
from tests.api_support import create_key, serve_api
from tests.integration.lane_helpers import run_to_end


async def test_a_run_names_its_request_and_a_resume_its_answer(
    store: RunStore, settings: Settings
) -> None:
    key = await create_key(KeyStore(store.pool), "acme", "ann")
    async with serve_api(settings) as api, api.client(key) as client:
        submitted = await client.post(
            "/v1/threads/t1/requests",
            json={"agent": "bot", "input": {"q": 1}, "request_id": "msg-1"},
        )
        run_id = submitted.json()["run_id"]
        run = (await client.get(f"/v1/runs/{run_id}")).json()
        assert run["request_id"] == "msg-1" and run["thread_id"] == "t1"
        listed = (await client.get("/v1/runs", params={"thread_id": "t1"})).json()
        assert [r["request_id"] for r in listed["items"]] == ["msg-1"]
        await run_to_end(store, UUID(run_id), Outcome.INTERRUPTED, interrupt={"ask": "ok?"})
        resumed = await client.post(f"/v1/runs/{run_id}/resume", json={"value": {"yes": 1}})
        assert resumed.status_code == 201
        body = resumed.json()
        assert body["resume_value"] == {"yes": 1} and body["resumed_from"] == run_id
        assert body["request_id"] is None or body["request_id"] == "msg-1"


async def test_another_users_idempotency_key_never_returns_their_run(
    store: RunStore, settings: Settings
) -> None:
    keys = KeyStore(store.pool)
    alice = await create_key(keys, "acme", "alice")
    bob = await create_key(keys, "acme", "bob")
    body = {"agent": "x", "input": {"secret": "alice's"}, "idempotency_key": "k1"}
    async with serve_api(settings) as api:
        async with api.client(alice) as client:
            first = await client.post("/v1/runs", json=body)
        async with api.client(bob) as client:
            second = await client.post("/v1/runs", json={**body, "input": {"mine": True}})
    assert first.status_code == second.status_code == 201
    assert second.json()["run_id"] != first.json()["run_id"]
    assert second.json()["input"] == {"mine": True}
