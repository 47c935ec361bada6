"""A worker process that reports its garbage collector (see
test_worker_collector.py): started once with the settings' threshold, it
works through ``N`` no-op runs, then starts a second worker, and prints
what the collector did as one JSON line.

    python -m tests.integration.collector_probe DATABASE_URL N
    python -m tests.integration.collector_probe DATABASE_URL api
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
from typing import Any

import psycopg

from runlane import App, RunContext
from runlane.settings import Settings
from runlane.worker import Worker


async def main(url: str, n: int) -> dict[str, Any]:
    settings = Settings(database_url=url, poll_seconds=0.05)
    app = App(settings)

    @app.agent("noop")
    async def noop(ctx: RunContext) -> Any:
        return None

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runlane.runs (agent, input, max_attempts)"
            " SELECT 'noop', '{}', 3 FROM generate_series(1, %s)",
            (n,),
        )
    before = gc.get_stats()[0]["collections"]
    worker = Worker(app, url, concurrency=100, settings=settings)
    await worker.start()
    frozen = gc.get_freeze_count()
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            for _ in range(600):
                cur = await conn.execute(
                    "SELECT count(*) FROM runlane.runs WHERE status <> 'completed'"
                )
                row = await cur.fetchone()
                if row is not None and row[0] == 0:
                    break
                await asyncio.sleep(0.05)
            else:
                raise TimeoutError("the runs did not complete in 30 s")
    finally:
        await worker.stop(grace_seconds=1.0)
    collections = gc.get_stats()[0]["collections"] - before
    second = Worker(app, url, concurrency=1, settings=settings)
    await second.start()
    await second.stop(grace_seconds=1.0)
    return {
        "threshold": gc.get_threshold()[0],
        "frozen_at_start": frozen,
        "frozen_after_second_start": gc.get_freeze_count(),
        "young_collections": collections,
    }


async def api(url: str) -> dict[str, Any]:
    """The HTTP API's process: its lifespan sets the collector."""
    from runlane.api import create_app

    app = create_app(Settings(database_url=url), url)
    async with app.router.lifespan_context(app):
        return {"threshold": gc.get_threshold()[0], "frozen_at_start": gc.get_freeze_count()}


if __name__ == "__main__":
    if sys.argv[2] == "api":
        result = asyncio.run(api(sys.argv[1]))
    else:
        result = asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    print(json.dumps(result), flush=True)
