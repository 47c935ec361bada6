"""Where a lane relay's time goes, with timestamps taken in the worker's
process.

    python -m bench.relay_breakdown [--k 200] [--runs 3] [--tag _s41] [--out-dir DIR]

One lane with ``--k`` queued requests, drained by a worker (concurrency
10) that runs in this process, its ``RunStore.finish_attempts_and_claim``
wrapped to stamp when each outcome batch is sent and answered. A lane's
next run is dispatched by the relay and claimed along in the transaction
that ends the run before it, so each gap is taken apart as:

- handler end -> batch sent: the outcome handed to the batcher, the batch
  made and its claim chosen;
- batch sent -> answered: the statements (the lanes' lock, the outcomes
  with the relay, the claim along), their commit and every round trip;
- answered -> next handler start: the claimed run decoded and started.

This process waits for the lane to drain on a connection of its own,
asynchronously, so that the wait never holds the worker's event loop.
For a before/after, run it with another checkout first on the path
(``PYTHONPATH=OTHER/src python -m bench.relay_breakdown``), alternating.
Results: ``bench/results/relay_breakdown{tag}.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import runlane_system
from bench.common import AGENT, bench_database, latency_summary, median, print_table, write_results
from bench.relay import REMAINING, submit_lanes

PARTS = ["handler end -> batch sent", "batch sent -> answered", "answered -> next start", "gap"]


async def drain_one_lane(url: str) -> list[tuple[str, float]]:
    """Runs a worker over the lane until nothing is left; its marks in order."""
    from runlane.app import App
    from runlane.context import RunContext
    from runlane.settings import Settings
    from runlane.worker import Worker

    marks: list[tuple[str, float]] = []
    app = App()

    @app.agent(AGENT)
    async def stamp(ctx: RunContext) -> Any:
        marks.append(("start", time.perf_counter()))
        marks.append(("end", time.perf_counter()))
        return None

    worker = Worker(app, url, concurrency=10, settings=Settings(database_url=url))
    finish = worker.store.finish_attempts_and_claim

    async def stamped(*args: Any, **kwargs: Any) -> Any:
        marks.append(("sent", time.perf_counter()))
        try:
            return await finish(*args, **kwargs)
        finally:
            marks.append(("answered", time.perf_counter()))

    worker.store.finish_attempts_and_claim = stamped  # type: ignore[method-assign]
    await worker.start()
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                cur = await conn.execute(REMAINING)
                row = await cur.fetchone()
                if row is not None and row[0] == 0:
                    break
                await asyncio.sleep(0.2)
            else:
                raise TimeoutError("the lane did not drain in 120 s")
    finally:
        await worker.stop(grace_seconds=1.0)
    return marks


def gaps(marks: list[tuple[str, float]]) -> dict[str, list[float]]:
    """Each relay's parts: a handler's end, the next batch sent and
    answered after it, then the next handler's start."""
    parts: dict[str, list[float]] = {name: [] for name in PARTS}
    step: dict[str, float] = {}
    for kind, at in marks:
        if kind == "end":
            step = {"end": at}
        elif kind in ("sent", "answered") and kind not in step and "end" in step:
            step[kind] = at
        elif kind == "start" and "answered" in step and "sent" in step:
            parts["handler end -> batch sent"].append(step["sent"] - step["end"])
            parts["batch sent -> answered"].append(step["answered"] - step["sent"])
            parts["answered -> next start"].append(at - step["answered"])
            parts["gap"].append(at - step["end"])
            step = {}
    return parts


def run(
    k: int = 200, runs: int = 3, *, tag: str = "", out_dir: Path | None = None
) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    with bench_database("relay_breakdown") as url:
        for rnd in range(runs):
            runlane_system.reset(url)
            asyncio.run(submit_lanes(url, 1, k, parallel=1))
            parts = gaps(asyncio.run(drain_one_lane(url)))
            summary = {name: latency_summary(values) for name, values in parts.items()}
            rounds.append({"round": rnd, "relays": len(parts["gap"]), "parts": summary})
            print(
                f"round {rnd}: {len(parts['gap'])} relays, gap p50"
                f" {summary['gap']['p50_ms']:.2f} ms, batch round trip p50"
                f" {summary['batch sent -> answered']['p50_ms']:.2f} ms",
                flush=True,
            )
    table = print_table(
        ["part", "p50 ms (median of rounds)", "p99 ms (median of rounds)"],
        [
            [
                name,
                median([r["parts"][name]["p50_ms"] for r in rounds]),
                median([r["parts"][name]["p99_ms"] for r in rounds]),
            ]
            for name in PARTS
        ],
    )
    data = {"k": k, "runs": runs, "rounds": rounds, "table": table}
    write_results(f"relay_breakdown{tag}", data, out_dir=out_dir)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.relay_breakdown")
    parser.add_argument("--k", type=int, default=200, help="requests queued in the lane")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    run(args.k, args.runs, tag=args.tag, out_dir=args.out_dir)


if __name__ == "__main__":
    main()
