"""Figure 3: lane relay — in one lane with queued requests, the time from
run N's end to run N+1's start; and many lanes x 10 queued requests
drained, every lane in order.

One lane: K requests are submitted through ``LaneService.submit`` (the
first is dispatched, the rest queue), then a worker process (mode
``stamp``, concurrency 10) starts. The relay gap is read two ways:
handler clocks (run N+1's handler start - run N's handler end, which
includes writing N's outcome, the relay trigger dispatching N+1 with its
NOTIFY, the wake-up and the claim) and database clocks
(the attempts' started_at of N+1 - ended_at of N).

Many lanes: L lanes x 10 requests are submitted (lanes concurrently, each
lane's requests in order), then a worker (concurrency 50) drains them.
Order check: in every lane, the runs' start order (started_at, seq) must be
the submission order.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from pathlib import Path
from typing import Any

import psycopg

from bench import runlane_system
from bench.common import (
    AGENT,
    bench_database,
    count,
    latency_summary,
    median,
    print_table,
    running,
    wait_for,
    write_results,
)

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"k": 5, "lanes": 10, "per_lane": 3},
    "small": {"k": 100, "lanes": 200, "per_lane": 10},
    "full": {"k": 200, "lanes": 1000, "per_lane": 10},
}


async def submit_lanes(url: str, lanes: int, per_lane: int, *, parallel: int = 8) -> None:
    """Submits per_lane requests into each of ``lanes`` threads; a lane's
    requests one after another, lanes ``parallel`` at a time."""
    from runlane.database import create_pool
    from runlane.lane_service import LaneService
    from runlane.lane_store import LaneStore
    from runlane.service import RunService
    from runlane.settings import Settings
    from runlane.store import RunStore

    pool = create_pool(url, min_size=1, max_size=parallel)
    await pool.open()
    lane_service = LaneService(
        LaneStore(pool), RunService(RunStore(pool), Settings(database_url=url))
    )
    todo: asyncio.Queue[int] = asyncio.Queue()
    for lane in range(lanes):
        todo.put_nowait(lane)

    async def submitter() -> None:
        while not todo.empty():
            lane = todo.get_nowait()
            for k in range(per_lane):
                await lane_service.submit(
                    tenant="default",
                    user_id="default",
                    agent=AGENT,
                    thread_id=f"t{lane}",
                    input={"lane": lane, "k": k},
                )

    try:
        await asyncio.gather(*(submitter() for _ in range(parallel)))
    finally:
        await pool.close()


# What a lane benchmark still has to do: requests queued and runs not done.
REMAINING = """
    SELECT (SELECT count(*) FROM runlane.requests WHERE status = 'queued')
         + (SELECT count(*) FROM runlane.runs WHERE status <> 'completed')
"""


def remaining(url: str) -> int:
    return count(url, REMAINING)


def one_lane_gaps(url: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            """
            SELECT (r.output ->> 'started')::float8, (r.output ->> 'ended')::float8,
                   extract(epoch FROM a.started_at), extract(epoch FROM a.ended_at)
            FROM runlane.runs AS r JOIN runlane.attempts AS a ON a.run_id = r.id
            ORDER BY a.started_at, r.seq
            """
        ).fetchall()
    handler = [float(b[0]) - float(a[1]) for a, b in itertools.pairwise(rows)]
    database = [float(b[2]) - float(a[3]) for a, b in itertools.pairwise(rows)]
    span = float(rows[-1][3]) - float(rows[0][2])
    return {
        "handler": latency_summary(handler),
        "database": latency_summary(database),
        "runs_per_s": len(rows) / span,
    }


def lanes_in_order(url: str) -> tuple[int, int]:
    """(lanes whose runs started in submission order, lanes)."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            """
            SELECT lane_id, array_agg((input ->> 'k')::int ORDER BY started_at, seq)
            FROM runlane.runs WHERE status = 'completed' GROUP BY lane_id
            """
        ).fetchall()
    ok = sum(1 for _, ks in rows if list(ks) == sorted(ks) and len(ks) == len(set(ks)))
    return ok, len(rows)


def run(size: str = "small", runs: int = 3, *, out_dir: Path | None = None) -> dict[str, Any]:
    cfg = SIZES[size]
    rounds: list[dict[str, Any]] = []
    with bench_database("relay") as url:
        for rnd in range(runs):
            runlane_system.reset(url)
            asyncio.run(submit_lanes(url, 1, cfg["k"], parallel=1))
            worker = runlane_system.spawn_worker(url, 10, mode="stamp")
            with running([worker]):
                worker.wait_ready()
                wait_for(lambda: remaining(url) == 0, timeout=120, what="one lane")
            one = one_lane_gaps(url)

            runlane_system.reset(url)
            asyncio.run(submit_lanes(url, cfg["lanes"], cfg["per_lane"]))
            worker = runlane_system.spawn_worker(url, 50, mode="stamp")
            with running([worker]):
                worker.wait_ready()
                wait_for(
                    lambda: remaining(url) == 0,
                    timeout=60 + cfg["lanes"] * cfg["per_lane"] / 20,
                    what="all lanes",
                )
            first, last = runlane_system.window(url)
            in_order, lanes = lanes_in_order(url)
            total = cfg["lanes"] * cfg["per_lane"]
            many = {
                "runs": total,
                "seconds": last - first,
                "runs_per_s": total / (last - first),
                "lanes_in_order": in_order,
                "lanes": lanes,
            }
            rounds.append({"round": rnd, "one_lane": one, "many_lanes": many})
            print(
                f"round {rnd}: relay p50 handler {one['handler']['p50_ms']:.2f} ms,"
                f" db {one['database']['p50_ms']:.2f} ms; {cfg['lanes']}x{cfg['per_lane']}"
                f" drained at {many['runs_per_s']:.0f} runs/s, {in_order}/{lanes} lanes in order",
                flush=True,
            )
    summary = {
        "relay_handler_p50_ms": median([r["one_lane"]["handler"]["p50_ms"] for r in rounds]),
        "relay_handler_p99_ms": median([r["one_lane"]["handler"]["p99_ms"] for r in rounds]),
        "relay_db_p50_ms": median([r["one_lane"]["database"]["p50_ms"] for r in rounds]),
        "relay_db_p99_ms": median([r["one_lane"]["database"]["p99_ms"] for r in rounds]),
        "one_lane_runs_per_s": median([r["one_lane"]["runs_per_s"] for r in rounds]),
        "many_lanes_runs_per_s": median([r["many_lanes"]["runs_per_s"] for r in rounds]),
        "all_lanes_in_order": all(
            r["many_lanes"]["lanes_in_order"] == r["many_lanes"]["lanes"] == cfg["lanes"]
            for r in rounds
        ),
    }
    summary["table"] = print_table(
        ["measure", "median of rounds"],
        [
            ["relay gap p50, handler clocks (ms)", summary["relay_handler_p50_ms"]],
            ["relay gap p99, handler clocks (ms)", summary["relay_handler_p99_ms"]],
            ["relay gap p50, database clocks (ms)", summary["relay_db_p50_ms"]],
            ["one lane, runs/s", summary["one_lane_runs_per_s"]],
            [f"{cfg['lanes']} lanes x {cfg['per_lane']}, runs/s", summary["many_lanes_runs_per_s"]],
            ["every lane in order, every round", summary["all_lanes_in_order"]],
        ],
    )
    data = {"size": size, "runs": runs, "config": cfg, "rounds": rounds, "summary": summary}
    write_results("relay", data, out_dir=out_dir)
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def main(args: argparse.Namespace) -> dict[str, Any]:
    return run(args.size, args.runs, out_dir=args.out_dir)
