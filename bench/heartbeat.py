"""Figure 5: heartbeat cost — a worker holding H long runs renews all its
leases in one statement per tick (``RunStore.renew_leases``, the statement
the worker's Heartbeat runs); against one UPDATE per run (autocommit, as a
worker renewing run by run would).

The runs are claimed for real (``claim_batch``) so the leases, tokens and
worker row are those a worker holds. Reported per tick: wall time, and the
CPU the PostgreSQL backend spent (read from /proc for the backend's pid —
the server runs on this machine). pg_stat_statements is not needed.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import runlane_system
from bench.common import (
    bench_database,
    latency_summary,
    median,
    print_table,
    process_cpu_seconds,
    write_results,
)

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"held": [20], "ticks": 3, "per_run_ticks": 1},
    "small": {"held": [100, 1000], "ticks": 20, "per_run_ticks": 2},
    "full": {"held": [100, 1000], "ticks": 30, "per_run_ticks": 3},
}

PER_RUN_UPDATE = """
UPDATE runlane.runs SET lease_expires_at = now() + make_interval(secs => %s)
WHERE id = %s AND lease_token = %s
  AND lease_expires_at > now()
"""


async def measure(url: str, held: int, ticks: int, per_run_ticks: int) -> dict[str, Any]:
    from runlane.database import create_pool
    from runlane.store import RunStore, WorkerIdentity

    runlane_system.reset(url)
    runlane_system.enqueue(url, held)
    pool = create_pool(url, min_size=1, max_size=1, check=False)
    await pool.open()
    store = RunStore(pool)
    worker = WorkerIdentity(
        id="bench-heartbeat", hostname="bench", pid=0, agents=None, concurrency=held
    )
    try:
        leases: list[tuple[Any, Any]] = []
        while len(leases) < held:
            batch = await store.claim_batch(
                worker_id=worker.id, limit=min(200, held - len(leases)), lease_seconds=600
            )
            leases.extend((c.id, c.lease_token) for c in batch)
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT pg_backend_pid() AS pid")
            row = await cur.fetchone()
            assert row is not None
            backend = int(row["pid"])
        one_statement, cpu_before = [], process_cpu_seconds(backend)
        for _ in range(ticks):
            t = time.perf_counter()
            alive = await store.renew_leases(leases, lease_seconds=600, worker=worker)
            one_statement.append(time.perf_counter() - t)
            assert len(alive) == held, f"{len(alive)} of {held} leases renewed"
        statement_cpu = (process_cpu_seconds(backend) - cpu_before) / ticks
    finally:
        await pool.close()

    per_run, per_run_cpu = [], []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT pg_backend_pid()")
        row2 = await cur.fetchone()
        assert row2 is not None
        backend = int(row2[0])
        for _ in range(per_run_ticks):
            cpu_before = process_cpu_seconds(backend)
            t = time.perf_counter()
            for run_id, token in leases:
                await conn.execute(PER_RUN_UPDATE, (600.0, run_id, token))
            per_run.append(time.perf_counter() - t)
            per_run_cpu.append(process_cpu_seconds(backend) - cpu_before)
    return {
        "held": held,
        "one_statement": latency_summary(one_statement),
        "one_statement_pg_cpu_ms": statement_cpu * 1000,
        "per_run_tick_ms": median(per_run) * 1000,
        "per_run_pg_cpu_ms": median(per_run_cpu) * 1000,
    }


def run(size: str = "small", runs: int = 3, *, out_dir: Path | None = None) -> dict[str, Any]:
    cfg = SIZES[size]
    rounds: list[dict[str, Any]] = []
    with bench_database("heartbeat") as url:
        for rnd in range(runs):
            for held in cfg["held"]:
                result = asyncio.run(measure(url, held, cfg["ticks"], cfg["per_run_ticks"]))
                result["round"] = rnd
                rounds.append(result)
                print(
                    f"round {rnd} held {held}: one statement p50"
                    f" {result['one_statement']['p50_ms']:.2f} ms"
                    f" (backend CPU {result['one_statement_pg_cpu_ms']:.2f} ms);"
                    f" one UPDATE per run {result['per_run_tick_ms']:.0f} ms"
                    f" (backend CPU {result['per_run_pg_cpu_ms']:.0f} ms)",
                    flush=True,
                )
    rows = []
    for held in cfg["held"]:
        mine = [r for r in rounds if r["held"] == held]
        row = {
            "held": held,
            "statement_p50_ms": median([r["one_statement"]["p50_ms"] for r in mine]),
            "statement_p99_ms": median([r["one_statement"]["p99_ms"] for r in mine]),
            "statement_pg_cpu_ms": median([r["one_statement_pg_cpu_ms"] for r in mine]),
            "per_run_tick_ms": median([r["per_run_tick_ms"] for r in mine]),
            "per_run_pg_cpu_ms": median([r["per_run_pg_cpu_ms"] for r in mine]),
        }
        row["wall_ratio"] = median(
            [r["per_run_tick_ms"] / r["one_statement"]["p50_ms"] for r in mine]
        )
        row["cpu_ratio"] = median(
            [
                r["per_run_pg_cpu_ms"] / r["one_statement_pg_cpu_ms"]
                for r in mine
                if r["one_statement_pg_cpu_ms"] > 0
            ]
        )
        rows.append(row)
    table = print_table(
        [
            "leases held",
            "one statement p50 ms",
            "p99 ms",
            "backend CPU ms/tick",
            "UPDATE per run, ms/tick",
            "backend CPU ms/tick",
            "wall ratio",
            "CPU ratio",
        ],
        [
            [
                r["held"],
                r["statement_p50_ms"],
                r["statement_p99_ms"],
                r["statement_pg_cpu_ms"],
                r["per_run_tick_ms"],
                r["per_run_pg_cpu_ms"],
                r["wall_ratio"],
                r["cpu_ratio"],
            ]
            for r in rows
        ],
    )
    data = {
        "size": size,
        "runs": runs,
        "config": cfg,
        "rounds": rounds,
        "summary": {"rows": rows, "table": table},
    }
    write_results("heartbeat", data, out_dir=out_dir)
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def main(args: argparse.Namespace) -> dict[str, Any]:
    return run(args.size, args.runs, out_dir=args.out_dir)
