"""Figure 4: scale with history — submit, claim and finish latency with 0,
100,000 and 1,000,000 finished runs in the tables.

One database per history size, filled in bulk (generate_series) with
completed runs, each with its attempt on the run (migration 0050; until
then a run_attempts row each), then VACUUM ANALYZE. Each round, in
every database in turn: M submits one at a time (``RunService.submit``),
M single claims (``RunStore.claim_batch(limit=1)``), M fenced finishes one
at a time (``RunStore.finish_attempts_status``, the worker's), and M claims
of 10 (so 11 M submits in all, then ANALYZE; until 2026-11-30 09:15 UTC
only M/10 claims of 10, too few for a steady p50, and no ANALYZE). Then,
with 5 runs submitted and 2 of them claimed, an operator's listing of the
live runs (pending, running and cancel_requested, every tenant, a page of
50: ``RunStore.list_runs``), M/10 times (at least 5; added 2026-12-05:
with so few live runs, a listing that walks the history to fill its page
reads all of it). The probe runs are deleted at the end of the round, so
every size stays exact. Within a round the databases' operations are
interleaved one by one (every database takes a step before the next, in
an order that rotates), so that the machine's drift falls on every size
alike; until the thirty-third session each database's operations ran
after the last one's, seconds apart, and on that session's machine the
same statement's p50 swung between 0.42 and 1.14 ms from one database's
turn to the next, so the ratios moved by as much (BENCHMARKS.md,
section 4). Target: each p50 of a submit and a claim within
1.2x of the empty database's (the finish and the listing are reported).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from bench.common import (
    AGENT,
    create_database,
    drop_database,
    latency_summary,
    median,
    plot,
    print_table,
    write_results,
)

T = TypeVar("T")

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"history": [0, 1000], "m": 20},
    "small": {"history": [0, 10_000, 100_000], "m": 200},
    "full": {"history": [0, 100_000, 1_000_000], "m": 300},
}


def fill_history(url: str, n: int) -> float:
    """n completed runs with one attempt each, spread over the last week."""
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        chunk = 200_000
        for low in range(0, n, chunk):
            high = min(n, low + chunk)
            # Each run's one attempt on the run, as the outcome write keeps
            # a run's last attempt since migration 0050 (no run_attempts row).
            conn.execute(
                """
                INSERT INTO runlane.runs (agent, input, output, status, max_attempts,
                                          attempts, claim_count, created_at, started_at,
                                          finished_at, available_at, attempt_started_at,
                                          attempt_worker_id, attempt_lease_token,
                                          attempt_ended_at, attempt_outcome)
                SELECT %s, jsonb_build_object('i', g), jsonb_build_object('ok', true),
                       'completed', 3, 1, 1, ts, ts, ts + interval '1 second', ts, ts,
                       'history', gen_random_uuid(), ts + interval '1 second', 'completed'
                FROM generate_series(%s::bigint, %s::bigint) AS g,
                     LATERAL (SELECT now() - interval '7 days'
                                     + (g * interval '7 days') / %s AS ts) AS t
                """,
                (AGENT, low + 1, high, max(n, 1)),
            )
        conn.execute("VACUUM ANALYZE runlane.runs")
        conn.execute("VACUUM ANALYZE runlane.run_attempts")
    return time.monotonic() - started


async def measure(urls: dict[int, str], m: int) -> dict[int, dict[str, Any]]:
    """One round: every database's operations interleaved one by one, each
    step in every database before the next (in an order that rotates), so
    that the machine's drift from second to second falls on every size
    alike. The result per history size."""
    from runlane.database import create_pool
    from runlane.models import ClaimedRun, Outcome, RunStatus
    from runlane.service import RunService
    from runlane.settings import Settings
    from runlane.store import Finish, RunStore

    sizes = list(urls)
    pools = {n: create_pool(url, min_size=1, max_size=2, check=False) for n, url in urls.items()}
    stores = {n: RunStore(pool) for n, pool in pools.items()}
    services = {n: RunService(stores[n], Settings(database_url=urls[n])) for n in sizes}
    ops = ("submit", "claim", "finish", "claim10", "list_live")
    seconds: dict[int, dict[str, list[float]]] = {n: {op: [] for op in ops} for n in sizes}
    claimed: dict[int, list[ClaimedRun]] = {n: [] for n in sizes}

    def in_turn(step: int) -> list[int]:
        k = step % len(sizes)
        return sizes[k:] + sizes[:k]

    async def timed(n: int, op: str, call: Awaitable[T]) -> T:
        t = time.perf_counter()
        result = await call
        seconds[n][op].append(time.perf_counter() - t)
        return result

    def finish(n: int, runs: list[ClaimedRun]) -> Awaitable[object]:
        return stores[n].finish_attempts_status(
            [Finish(c.id, c.lease_token, Outcome.COMPLETED) for c in runs]
        )

    def claim(n: int, limit: int) -> Awaitable[list[ClaimedRun]]:
        return stores[n].claim_batch(worker_id="bench-history", limit=limit, lease_seconds=60)

    try:
        for pool in pools.values():
            await pool.open()
        for step in range(m + 10 * m):
            for n in in_turn(step):
                await timed(n, "submit", services[n].submit(AGENT, {"probe": True}))
        # Statistics as autovacuum would keep them (this server runs with
        # it off): the claim's plan depends on them, and a table analyzed
        # empty makes the empty database's claims read every pending run.
        for n in sizes:
            async with pools[n].connection() as conn:
                await conn.execute("ANALYZE runlane.runs")
        for step in range(m):
            for n in in_turn(step):
                claimed[n].extend(await timed(n, "claim", claim(n, 1)))
        for step in range(m):
            for n in in_turn(step):
                if step < len(claimed[n]):
                    await timed(n, "finish", finish(n, [claimed[n][step]]))
        for step in range(m):
            for n in in_turn(step):
                await finish(n, await timed(n, "claim10", claim(n, 10)))
        live = [RunStatus.PENDING, RunStatus.RUNNING, RunStatus.CANCEL_REQUESTED]
        for n in sizes:
            for _ in range(5):
                await services[n].submit(AGENT, {"probe": True})
            await claim(n, 2)
        for step in range(max(5, m // 10)):
            for n in in_turn(step):
                listed = await timed(n, "list_live", stores[n].list_runs(statuses=live, limit=50))
                assert len(listed) == 5, len(listed)
    finally:
        for pool in pools.values():
            await pool.close()
    for url in urls.values():
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DELETE FROM runlane.runs WHERE input ? 'probe'")
    return {n: {op: latency_summary(seconds[n][op]) for op in ops} for n in sizes}


def run(size: str = "small", runs: int = 3, *, out_dir: Path | None = None) -> dict[str, Any]:
    cfg = SIZES[size]
    urls: dict[int, str] = {}
    fill_seconds: dict[int, float] = {}
    rounds: list[dict[str, Any]] = []
    try:
        for n in cfg["history"]:
            urls[n] = create_database(f"history{n}")
            fill_seconds[n] = fill_history(urls[n], n) if n else 0.0
            print(f"history {n:,}: filled in {fill_seconds[n]:.1f}s", flush=True)
        for rnd in range(runs):
            results = asyncio.run(measure(urls, cfg["m"]))
            for n, result in results.items():
                rounds.append({"round": rnd, "history": n, **result})
                print(
                    f"round {rnd} history {n:>9,}: submit p50"
                    f" {result['submit']['p50_ms']:.2f} ms, claim p50"
                    f" {result['claim']['p50_ms']:.2f} ms, finish p50"
                    f" {result['finish']['p50_ms']:.2f} ms",
                    flush=True,
                )
    finally:
        for url in urls.values():
            with contextlib.suppress(Exception):
                drop_database(url)
    ops = ("submit", "claim", "finish", "claim10", "list_live")
    summary: dict[str, Any] = {"rows": []}
    base: dict[str, float] = {}
    for n in cfg["history"]:
        row: dict[str, Any] = {"history": n}
        for op in ops:
            row[f"{op}_p50_ms"] = median([r[op]["p50_ms"] for r in rounds if r["history"] == n])
            row[f"{op}_p99_ms"] = median([r[op]["p99_ms"] for r in rounds if r["history"] == n])
            if n == cfg["history"][0]:
                base[op] = row[f"{op}_p50_ms"]
            # Per-round ratio to the empty database measured in the same round.
            ratios = []
            for rnd in range(runs):
                here = [r for r in rounds if r["round"] == rnd and r["history"] == n]
                empty = [
                    r for r in rounds if r["round"] == rnd and r["history"] == cfg["history"][0]
                ]
                if here and empty:
                    ratios.append(here[0][op]["p50_ms"] / empty[0][op]["p50_ms"])
            row[f"{op}_ratio"] = median(ratios)
        summary["rows"].append(row)
    summary["table"] = print_table(
        [
            "finished runs",
            "submit p50 ms",
            "ratio",
            "claim-1 p50 ms",
            "ratio",
            "finish p50 ms",
            "ratio",
            "claim-10 p50 ms",
            "ratio",
            "live listing p50 ms",
            "ratio",
        ],
        [
            [
                f"{row['history']:,}",
                *[v for op in ops for v in (row[f"{op}_p50_ms"], row[f"{op}_ratio"])],
            ]
            for row in summary["rows"]
        ],
    )
    xs = [row["history"] for row in summary["rows"]]
    plot(
        "history",
        {f"{op} p50": (xs, [row[f"{op}_p50_ms"] for row in summary["rows"]]) for op in ops},
        title="Latency against finished runs in the tables (median of rounds)",
        xlabel="finished runs (symlog)",
        ylabel="p50 latency, ms",
        logx=True,
        out_dir=out_dir,
    )
    data = {
        "size": size,
        "runs": runs,
        "config": cfg,
        "fill_seconds": fill_seconds,
        "rounds": rounds,
        "summary": summary,
    }
    write_results("history", data, out_dir=out_dir)
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def main(args: argparse.Namespace) -> dict[str, Any]:
    return run(args.size, args.runs, out_dir=args.out_dir)
