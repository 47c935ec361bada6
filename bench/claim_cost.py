"""PostgreSQL's CPU per claim and finish, by batch size: what a batch
costs whatever its size, and what each run in it adds.

    python -m bench.claim_cost [--batches 1,10,50,200] [--runs-per-size 4000]
                               [--rounds 3] [--peers pgqueuer] [--tag _s10]
                               [--sql "CREATE OR REPLACE FUNCTION ..."]
                               [--tenant-cap 100000]

One connection (the worker's ``RunStore``, its prepared statements) claims
``k`` runs and finishes them (``completed``), over and over, on a queue of
pending no-op runs; the CPU its backend spent (``/proc``) is divided by the
claim-and-finish pairs. A straight line through the sizes gives the fixed
cost of a pair (its intercept) and the cost per run (its slope). Then,
as yardsticks on the same connection: ``SELECT 1`` (a round trip) and
a one-row INSERT with its commit. With ``--peers pgqueuer`` the same
for PGQueuer on a database of its own: its dequeue of ``k`` jobs and
their move to its log (``Queries.dequeue``, ``Queries.log_jobs``: what its
QueueManager sends). The database's ``synchronous_commit`` is the
benchmark's (``RUNLANE_BENCH_SYNCHRONOUS_COMMIT``, default on). Results:
``bench/results/claim_cost{tag}.json``. With ``--sql``, an experiment: a
second database gets that SQL after its migrations, and its rounds
alternate with those of the database as migrated, so that a schema or
function change is a before/after measured in the same rounds. With
``--tenant-cap N`` the runs' tenant has a cap of N running runs (set it
above the largest batch): while any tenant has a cap every claim is the
capped claim (``runlane.claim_capped_runs``), which this measures instead
of the uncapped one.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import psycopg

from bench import runlane_system
from bench.common import AGENT, bench_database, print_table, process_cpu_seconds, write_results
from bench.peers import pgqueuer_adapter


async def backend_cpu_us(pid: int, call: Callable[[], Awaitable[Any]], times: int) -> float:
    """Microseconds of the backend's CPU per call, after five calls to warm up."""
    for _ in range(5):
        await call()
    before = process_cpu_seconds(pid)
    for _ in range(times):
        await call()
    return (process_cpu_seconds(pid) - before) / times * 1e6


async def measure(
    url: str, batches: list[int], runs_per_size: int, tenant_cap: int | None = None
) -> dict[str, float]:
    from runlane.database import create_pool
    from runlane.models import Outcome
    from runlane.store import Finish, RunStore

    pool = create_pool(url, min_size=1, max_size=1, check=False)
    await pool.open()
    try:
        store = RunStore(pool)
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT pg_backend_pid() AS pid")
            row = await cur.fetchone()
            assert row is not None
            pid = int(row["pid"])
            await conn.execute("CREATE TABLE IF NOT EXISTS bench_one_row (x int)")
        result: dict[str, float] = {}
        for k in batches:
            runlane_system.reset(url)
            pairs = max(20, runs_per_size // k)
            runlane_system.enqueue(url, (pairs + 5) * k)
            if tenant_cap is not None:
                async with pool.connection() as conn:
                    await conn.execute(
                        "INSERT INTO runlane.tenant_limits (tenant, max_running)"
                        " VALUES ('default', %s)",
                        (tenant_cap,),
                    )

            async def claim_and_finish(k: int = k) -> None:
                claimed = await store.claim_batch(
                    worker_id="claim-cost", limit=k, lease_seconds=60, aging_seconds=60
                )
                assert len(claimed) == k, "the queue ran out"
                await store.finish_attempts_status(
                    [Finish(c.id, c.lease_token, Outcome.COMPLETED) for c in claimed]
                )

            result[f"pair_{k}"] = await backend_cpu_us(pid, claim_and_finish, pairs)

        async def select_one() -> None:
            async with pool.connection() as conn:
                await conn.execute("SELECT 1", prepare=True)

        async def insert_one_row() -> None:
            async with pool.connection() as conn:
                await conn.execute("INSERT INTO bench_one_row VALUES (1)", prepare=True)

        result["select_1"] = await backend_cpu_us(pid, select_one, 2000)
        result["insert_one_row"] = await backend_cpu_us(pid, insert_one_row, 2000)
        return result
    finally:
        await pool.close()


async def measure_pgqueuer(url: str, batches: list[int], runs_per_size: int) -> dict[str, float]:
    from pgqueuer.ports.repository import EntrypointExecutionParameter

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    try:
        queries = await pgqueuer_adapter._queries(conn)
        row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
        assert row is not None
        pid = int(row[0])
        entrypoints = {AGENT: EntrypointExecutionParameter(concurrency_limit=0)}
        manager_id = uuid.uuid4()
        result: dict[str, float] = {}
        for k in batches:
            pgqueuer_adapter.reset(url)
            pairs = max(20, runs_per_size // k)
            await pgqueuer_adapter._enqueue(url, (pairs + 5) * k)
            await conn.execute("ANALYZE pgqueuer")

            async def dequeue_and_log(k: int = k) -> None:
                jobs = await queries.dequeue(
                    batch_size=k,
                    entrypoints=entrypoints,
                    queue_manager_id=manager_id,
                    global_concurrency_limit=None,
                    heartbeat_timeout=timedelta(seconds=30),
                )
                assert len(jobs) == k, "the queue ran out"
                await queries.log_jobs([(job, "successful", None) for job in jobs])

            result[f"pair_{k}"] = await backend_cpu_us(pid, dequeue_and_log, pairs)
        return result
    finally:
        await conn.close()


def summarize(batches: list[int], trials: list[dict[str, float]]) -> dict[str, Any]:
    medians = {key: statistics.median(t[key] for t in trials) for key in trials[0]}
    fixed, per_run = fit(batches, [medians[f"pair_{k}"] for k in batches])
    return {"medians_us": medians, "fixed_us_per_pair": fixed, "us_per_run": per_run}


def fit(batches: list[int], us: list[float]) -> tuple[float, float]:
    """(fixed µs per pair, µs per run): least squares through (k, µs)."""
    if len(batches) < 2:
        return us[0], 0.0
    slope, intercept = statistics.linear_regression(batches, us)
    return intercept, slope


def print_round(label: str, trial: dict[str, float]) -> None:
    print(f"{label}: " + ", ".join(f"{key} {us:.0f} µs" for key, us in trial.items()), flush=True)


def run(
    batches: list[int],
    runs_per_size: int,
    rounds: int,
    *,
    peers: list[str] | None = None,
    tag: str = "",
    sql: str | None = None,
    out_dir: Any = None,
    tenant_cap: int | None = None,
) -> dict[str, Any]:
    trials: list[dict[str, float]] = []
    sql_trials: list[dict[str, float]] = []
    peer_trials: list[dict[str, float]] = []
    with_pgqueuer = "pgqueuer" in (peers or [])
    if with_pgqueuer and (why := pgqueuer_adapter.available()):
        print(f"pgqueuer skipped: {why}")
        with_pgqueuer = False
    with bench_database("claim_cost") as url, ExitStack() as stack:
        runlane_system.setup(url)
        sql_url = None
        if sql:
            sql_url = stack.enter_context(bench_database("claim_cost_sql"))
            runlane_system.setup(sql_url)
            with psycopg.connect(sql_url, autocommit=True) as conn:
                conn.execute(sql)
        for i in range(rounds):
            trial = asyncio.run(measure(url, batches, runs_per_size, tenant_cap))
            trials.append(trial)
            print_round(f"round {i}", trial)
            if sql_url:
                trial = asyncio.run(measure(sql_url, batches, runs_per_size, tenant_cap))
                sql_trials.append(trial)
                print_round(f"round {i} with --sql", trial)
    if with_pgqueuer:
        with bench_database("claim_cost_pgqueuer", runlane_schema=False) as url:
            pgqueuer_adapter.setup(url)
            for i in range(rounds):
                trial = asyncio.run(measure_pgqueuer(url, batches, runs_per_size))
                peer_trials.append(trial)
                print(
                    f"round {i} pgqueuer: " + ", ".join(f"{k} {v:.0f} µs" for k, v in trial.items())
                )
    summary = summarize(batches, trials)
    medians = summary["medians_us"]
    fixed, per_run = summary["fixed_us_per_pair"], summary["us_per_run"]
    pair_us = [medians[f"pair_{k}"] for k in batches]
    headers = ["runs per claim", "µs per claim + finish", "µs per run"]
    rows: list[list[Any]] = [
        [k, f"{us:.0f}", f"{us / k:.1f}"] for k, us in zip(batches, pair_us, strict=True)
    ]
    if sql_trials:
        summary["with_sql"] = summarize(batches, sql_trials)
        sql_medians = summary["with_sql"]["medians_us"]
        headers += ["with --sql: µs per claim + finish", "µs per run"]
        for row, k in zip(rows, batches, strict=True):
            row += [f"{sql_medians[f'pair_{k}']:.0f}", f"{sql_medians[f'pair_{k}'] / k:.1f}"]
    if peer_trials:
        peer_us = [statistics.median(t[f"pair_{k}"] for t in peer_trials) for k in batches]
        peer_fixed, peer_per_run = fit(batches, peer_us)
        summary["pgqueuer"] = {
            "medians_us": dict(zip([f"pair_{k}" for k in batches], peer_us, strict=True)),
            "fixed_us_per_pair": peer_fixed,
            "us_per_run": peer_per_run,
        }
        headers += ["PGQueuer: µs per dequeue + log", "µs per job"]
        for row, us, k in zip(rows, peer_us, batches, strict=True):
            row += [f"{us:.0f}", f"{us / k:.1f}"]
    print_table(headers, rows)
    print(
        f"fit: {fixed:.0f} µs per claim + finish whatever its size, {per_run:.1f} µs per run;"
        f" SELECT 1 {medians['select_1']:.0f} µs, one-row INSERT {medians['insert_one_row']:.0f} µs"
    )
    if sql_trials:
        with_sql = summary["with_sql"]
        print(
            f"with --sql: {with_sql['fixed_us_per_pair']:.0f} µs per claim + finish whatever"
            f" its size, {with_sql['us_per_run']:.1f} µs per run"
        )
    if peer_trials:
        peer = summary["pgqueuer"]
        print(
            f"PGQueuer: {peer['fixed_us_per_pair']:.0f} µs per dequeue + log whatever its size,"
            f" {peer['us_per_run']:.1f} µs per job"
        )
    write_results(
        f"claim_cost{tag}",
        {
            "batches": batches,
            "runs_per_size": runs_per_size,
            "trials": trials,
            "sql": sql,
            "tenant_cap": tenant_cap,
            "sql_trials": sql_trials,
            "pgqueuer_trials": peer_trials,
            "summary": summary,
        },
        out_dir=out_dir,
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.claim_cost")
    parser.add_argument("--batches", default="1,10,50,200", help="runs per claim, comma-separated")
    parser.add_argument("--runs-per-size", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peers", default="", help="comma-separated: pgqueuer")
    parser.add_argument("--tag", default="")
    parser.add_argument(
        "--sql", default=None, help="experiment: SQL run on a second database, rounds alternating"
    )
    parser.add_argument(
        "--tenant-cap",
        type=int,
        default=None,
        help="a cap of this many running runs on the runs' tenant: every claim is the capped one",
    )
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    peers = [p for p in args.peers.split(",") if p]
    run(
        batches,
        args.runs_per_size,
        args.rounds,
        peers=peers,
        tag=args.tag,
        sql=args.sql,
        tenant_cap=args.tenant_cap,
    )


if __name__ == "__main__":
    main()
