"""schemathesis over the live API's /openapi.json (issue 4): generated
requests for every operation, with a bounded number of examples each; no
answer is a server error and every answer matches the documented schema.

schemathesis calls the API with blocking ``requests``, so the server (uvicorn
on a free port, as in production) runs on its own event loop in a thread.
Each operation is exercised three ways, each with at most MAX_EXAMPLES
generated requests (LONG_MAX_EXAMPLES with ``pytest --long``):

- ``positive``: schema-valid requests, plus the documented examples;
- ``negative``: requests that break the schema;
- ``existing``: schema-valid requests whose path parameters name objects
  that exist (runs and requests in several states, lanes with a running,
  queued and interrupted run), so that the 200/201/409 answers with real
  bodies are validated too, not only 404s.

Every response goes through every built-in check of schemathesis
(not_a_server_error, status_code_conformance, content_type_conformance,
response_headers_conformance, response_schema_conformance,
positive_data_acceptance, negative_data_rejection, and the others where
they apply).

The SSE routes (``/events``) are left out: on an unfinished run they stream
until the client leaves, which a generated call never does; their statuses
and bodies are covered by test_api_streams.py and test_api_endpoints.py.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
import psycopg
import pytest
import requests
import schemathesis
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.config import SchemathesisConfig
from schemathesis.generation import GenerationMode

from runlane.api import create_app
from runlane.models import ClaimedRun, Outcome
from runlane.settings import Settings
from runlane.store import RunStore
from tests.api_support import ApiServer, create_key, serve_api
from tests.conftest import database_url

# Generated requests per operation and mode (the documented examples come on
# top); the whole module stays under a minute.
MAX_EXAMPLES = 25
# With `pytest --long` (the fault suite's large sizes, issue 7).
LONG_MAX_EXAMPLES = 250

AGENT = "support-bot"


def operations() -> list[tuple[str, str, bool]]:
    """(method, path, has_inputs) of every documented operation but the SSE
    streams. Building the app opens no connection, so this runs at
    collection."""
    document = create_app(Settings(database_url="postgresql:///unused"), "unused").openapi()
    return [
        (method.upper(), path, bool(spec.get("parameters") or spec.get("requestBody")))
        for path, item in document["paths"].items()
        for method, spec in item.items()
        if not path.endswith("/events")
    ]


@dataclass
class LiveApi:
    base_url: str
    key: str
    # Path parameter name -> values that name existing objects.
    existing: dict[str, list[str]] = field(default_factory=dict)


async def claim_run(store: RunStore, run_id: str) -> ClaimedRun:
    batch = await store.claim_batch(worker_id="schema-host", limit=1, lease_seconds=300)
    assert batch and str(batch[0].id) == run_id, "another run was claimable"
    return batch[0]


async def finish_run(store: RunStore, run_id: str, outcome: Outcome, **kwargs: Any) -> None:
    claimed = await claim_run(store, run_id)
    finished = await store.finish_attempt(
        claimed.id, claimed.lease_token, outcome, lane_id=claimed.lane_id, **kwargs
    )
    assert finished is not None


async def seed(server: ApiServer, key: str) -> dict[str, list[str]]:
    """Objects for the ``existing`` mode: one of each interesting state."""
    store: RunStore = server.context.runs.store
    async with server.client(key) as client:

        async def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            response = await client.post(path, json=body)
            assert response.status_code == 201, response.text
            reply: dict[str, Any] = response.json()
            return reply

        failed = await post("/v1/runs", {"agent": "report-writer", "input": {"n": 1}})
        await finish_run(store, failed["run_id"], Outcome.FAILED, error={"code": "boom"})
        running = await post("/v1/threads/t1/requests", {"agent": AGENT, "input": "one"})
        await claim_run(store, running["run_id"])
        queued = await post(
            "/v1/threads/t1/requests", {"agent": AGENT, "input": "two", "request_id": "queued-1"}
        )
        interrupted = await post("/v1/threads/t2/requests", {"agent": AGENT, "input": "q"})
        await finish_run(store, interrupted["run_id"], Outcome.INTERRUPTED, interrupt={"ask": 1})
        # Pending last, so that nothing above claims it.
        pending = await post("/v1/runs", {"agent": "report-writer", "input": {"n": 2}})
    return {
        "run_id": [
            str(pending["run_id"]),
            str(failed["run_id"]),
            str(running["run_id"]),
            str(interrupted["run_id"]),
        ],
        "request_id": [running["request_id"], queued["request_id"]],
        "thread_id": ["t1", "t2"],
    }


@pytest.fixture(scope="module")
def module_settings(pg_server_url: str, template_db: str) -> Iterator[Settings]:
    """One fresh database for the whole module: the checks hold in any
    state, and one server start instead of one per test saves most of the
    module's time."""
    name = f"runlane_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}" STRATEGY FILE_COPY')
    try:
        yield Settings(
            database_url=database_url(pg_server_url, name),
            data_dir=Path("/nonexistent-runlane-test-data"),
        )
    finally:
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def live_api(module_settings: Settings) -> Iterator[LiveApi]:
    """The API served from a thread with its own event loop, an admin key
    (admins reach every route, retry included) and seeded objects."""
    settings = module_settings
    ready = threading.Event()
    started: list[tuple[asyncio.AbstractEventLoop, asyncio.Event, LiveApi]] = []
    errors: list[BaseException] = []

    async def serve() -> None:
        stop = asyncio.Event()
        async with serve_api(settings) as server:
            key = await create_key(server.context.keys, "acme", "ann", admin=True)
            api = LiveApi(server.base_url, key, await seed(server, key))
            started.append((asyncio.get_running_loop(), stop, api))
            ready.set()
            await stop.wait()

    def main() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:
            errors.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=main, name="live-api", daemon=True)
    thread.start()
    assert ready.wait(60), "the API did not start within 60 s"
    if errors:
        raise errors[0]
    loop, stop, api = started[0]
    try:
        yield api
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        assert not thread.is_alive(), "the API did not stop within 30 s"
        if errors:
            raise errors[0]


def load_schema(api: LiveApi) -> Any:
    config = SchemathesisConfig.from_dict(
        {
            "base-url": api.base_url,
            "headers": {"Authorization": f"Bearer {api.key}"},
            # By design, not a bug: PostgreSQL cannot store U+0000, and the
            # API refuses it with 422 validation_error (a JSON schema cannot
            # say so for "any JSON value"); test_api_endpoints.py checks the
            # 422 (test_a_nul_character_answers_422).
            "generation": {"allow-x00": False},
            "operations": [
                {
                    # The cursor is opaque: any string fits its schema, and
                    # one the API never gave out is refused with 422.
                    "include-path": "/v1/runs",
                    "include-method": "GET",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "401", "403", "404", "409", "422"]
                        }
                    },
                }
            ],
        }
    )
    return schemathesis.openapi.from_url(f"{api.base_url}/openapi.json", config=config, timeout=10)


def strategies_for(
    operation: Any, api: LiveApi, mode: str
) -> list[st.SearchStrategy[schemathesis.Case]]:
    if mode == "positive":
        return [
            operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
            *operation.get_strategies_from_examples(),
        ]
    if mode == "negative":
        return [operation.as_strategy(generation_mode=GenerationMode.NEGATIVE)]
    names = [p.name for p in operation.path_parameters]
    assert names, "existing mode needs path parameters"
    found = []
    for name in names:
        for value in api.existing[name]:
            found.append(
                operation.as_strategy(
                    generation_mode=GenerationMode.POSITIVE, path_parameters={name: value}
                )
            )
            if name == "thread_id" and "agent" in {p.name for p in operation.query}:
                # That thread's real lane, not only lanes of random agents.
                found.append(
                    operation.as_strategy(
                        generation_mode=GenerationMode.POSITIVE,
                        path_parameters={name: value},
                        query={"agent": AGENT},
                    )
                )
    return found


def check_operation(
    api: LiveApi, method: str, path: str, mode: str, max_examples: int = MAX_EXAMPLES
) -> list[int]:
    """Sends the generated requests of one operation and validates every
    answer; returns the statuses answered."""
    operation = load_schema(api)[path][method]
    statuses: list[int] = []

    with requests.Session() as session:

        @hypothesis.settings(
            max_examples=max_examples,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
        @hypothesis.given(case=st.one_of(strategies_for(operation, api, mode)))
        def generated(case: schemathesis.Case) -> None:
            response = case.call(session=session, timeout=10)
            statuses.append(response.status_code)
            case.validate_response(response, transport_kwargs={"session": session, "timeout": 10})

        try:
            generated()
        except Unsatisfiable:
            if mode != "negative":
                raise
            pytest.fail("no request can break this operation's schema: add it to RUN_ID_ONLY")
    return statuses


RUN_ID_ONLY = frozenset(
    {"/v1/runs/{run_id}", "/v1/runs/{run_id}/cancel", "/v1/runs/{run_id}/retry"}
)


def cases() -> list[Any]:
    found = []
    for method, path, has_inputs in operations():
        modes = ["positive"]
        # A run id is any string in the schema, so an operation whose only
        # input it is has no schema-breaking request: no negative mode there.
        if has_inputs and path not in RUN_ID_ONLY:
            modes.append("negative")
        if "{" in path:
            modes.append("existing")
        for mode in modes:
            found.append(pytest.param(method, path, mode, id=f"{method} {path} {mode}"))
    return found


@pytest.mark.parametrize(("method", "path", "mode"), cases())
def test_operation_matches_its_openapi_document(
    live_api: LiveApi, method: str, path: str, mode: str, request: pytest.FixtureRequest
) -> None:
    long_mode = bool(request.config.getoption("--long"))
    examples = LONG_MAX_EXAMPLES if long_mode else MAX_EXAMPLES
    statuses = check_operation(live_api, method, path, mode, examples)
    assert statuses
    if mode == "existing":
        # The seeded objects were found: not every answer is a 404.
        assert set(statuses) != {404}, statuses
