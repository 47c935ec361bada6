"""Figure 1: throughput — no-op runs, an N-run burn-down, 1 and 2 worker
processes, concurrency 10/50/200; runlane against PGQueuer (on its psycopg
and its asyncpg driver) and oban (with and without its table's statistics:
bench/peers/oban_adapter.py) in the same database server, and the
bare-SQL limit of a SKIP LOCKED claim + ack driven by pgbench.

Each trial: reset the system's tables, enqueue N jobs in bulk (untimed),
start the worker process(es) behind a start gate, wait until every job is
done. The gate is a lock on the system's queue table (EXCLUSIVE: reads
pass, claims wait), held until every worker process has said it serves,
so that all of them start claiming at once, instead of the first process
to start burning down the queue alone while the next is still importing
on the same two cores. The rate is N divided by the window from the
gate's opening (or the first claim, if later) to the last completion,
both read from the database clock, so process start-up is not counted.
The trials of all systems are interleaved, round after round, and each
figure is the median of the rounds; ratios are medians of per-round
ratios.

Beside that burn-down rate, each trial gives a steady rate: the jobs
completed between the moments 10% and 90% of them were, over that
window, so that what a system does once at its start or its end weighs
nothing. It was added when PGQueuer's start turned out to take a second
in most trials (seventeenth session, BENCHMARKS.md section 1): its worker
(psycopg driver, one connection) waits for notifications on that
connection for up to a second at a time, holding it, and a queue filled
before it started gives it none, so its first completions wait out that
second; once jobs flow, its own statements' notifications end each wait
at once. The burn-down rate of a 20,000-job queue, one or two seconds
long, counts that second in full.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import runlane_system
from bench.common import (
    backend_pids,
    bench_database,
    median,
    plot,
    print_table,
    process_cpu_seconds,
    running,
    synchronous_commit,
    wait_for,
    write_results,
)

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "n": 100,
        "procs": [1],
        "concurrency": [10],
        "pgbench_seconds": 1,
        "pgbench_batches": [10],
    },
    "small": {"n": 5000, "procs": [1, 2], "concurrency": [10, 50, 200], "pgbench_seconds": 5},
    "full": {"n": 20000, "procs": [1, 2], "concurrency": [10, 50, 200], "pgbench_seconds": 10},
}


# The peers: runlane's ratio is to the best of those in the run.
PEERS = ("pgqueuer", "pgqueuer-asyncpg", "oban", "oban-unanalyzed")

# The CPU per job of a summary row (key suffix: the trials' field), in ms.
CPU_COLUMNS = {
    "pg_cpu_ms": "pg_cpu_ms_per_job",
    "worker_cpu_ms": "worker_cpu_ms_per_job",
    "pg_cpu_in_window_ms": "pg_cpu_in_window_ms_per_job",
    "worker_cpu_in_window_ms": "worker_cpu_in_window_ms_per_job",
}

# The steady rate's window: from the moment this fraction of the jobs were
# completed to the moment that fraction were.
STEADY = (0.1, 0.9)


def systems(names: list[str]) -> tuple[list[Any], dict[str, str]]:
    """The systems to run, and those skipped with the reason."""
    from bench.peers import oban_adapter, pgqueuer_adapter
    from bench.runlane_variants import VARIANTS

    known: dict[str, Any] = {
        "runlane": runlane_system,
        "pgqueuer": pgqueuer_adapter,
        "pgqueuer-asyncpg": pgqueuer_adapter.ON_ASYNCPG,
        "oban": oban_adapter,
        "oban-unanalyzed": oban_adapter.WITHOUT_STATISTICS,
        **VARIANTS,
    }
    chosen, skipped = [], {}
    for name in names:
        module = known[name]
        why = module.available()
        if why is None:
            chosen.append(module)
        else:
            skipped[name] = why
    return chosen, skipped


def trial(
    system: Any,
    url: str,
    *,
    n: int,
    procs: int,
    concurrency: int,
    profile: str | None = None,
) -> dict[str, Any]:
    system.reset(url)
    system.enqueue(url, n)
    kwargs: dict[str, Any] = {"profile": profile} if profile else {}
    with psycopg.connect(url) as gate:
        gate.execute(f"LOCK TABLE {system.QUEUE_TABLE} IN EXCLUSIVE MODE")
        workers = [system.spawn_worker(url, concurrency, **kwargs) for _ in range(procs)]
        with running(workers):
            for worker in workers:
                worker.wait_ready()
            # The CPU already spent (each worker's start, its backends'
            # set-up): subtracted for the CPU in the window.
            worker_cpu_at_gate = sum(w.cpu_seconds() for w in workers)
            pg_cpu_at_gate = {pid: process_cpu_seconds(pid) for pid in backend_pids(url)}
            opened = open_gate(gate)
            wait_for(
                lambda: system.remaining(url) == 0,
                timeout=60 + n / 100,
                interval=0.1,
                what=f"{system.NAME} to finish {n} jobs",
            )
            worker_cpu = sum(w.cpu_seconds() for w in workers)
            pg_cpus = {pid: process_cpu_seconds(pid) for pid in backend_pids(url)}
            pg_cpu = sum(pg_cpus.values())
            pg_cpu_in_window = sum(
                cpu - pg_cpu_at_gate.get(pid, 0.0) for pid, cpu in pg_cpus.items()
            )
    first, last = system.window(url)
    # Claims that waited at the gate carry the time they began waiting.
    seconds = last - max(first, opened)
    steady_from, steady_to = system.steady_window(url, STEADY[0], STEADY[1])
    steady_seconds = steady_to - steady_from
    return {
        "system": system.NAME,
        "procs": procs,
        "concurrency": concurrency,
        "n": n,
        "seconds": seconds,
        "jobs_per_s": n / seconds,
        "steady_seconds": steady_seconds,
        "steady_jobs_per_s": (STEADY[1] - STEADY[0]) * n / max(steady_seconds, 1e-6),
        "worker_cpu_ms_per_job": worker_cpu * 1000 / n,
        "pg_cpu_ms_per_job": pg_cpu * 1000 / n,
        # From the gate's opening to the last completion seen: what the
        # burn-down itself cost, without each process's start.
        "worker_cpu_in_window_ms_per_job": (worker_cpu - worker_cpu_at_gate) * 1000 / n,
        "pg_cpu_in_window_ms_per_job": pg_cpu_in_window * 1000 / n,
    }


def open_gate(gate: psycopg.Connection[Any]) -> float:
    """Commits the gate's transaction, and its lock with it: the moment, on
    the database clock, in epoch seconds."""
    row = gate.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    gate.commit()
    assert row is not None
    return float(row[0])


# -- pgbench: the bare SQL limit -------------------------------------------------

CLAIM_TABLE = """
DROP TABLE IF EXISTS bench_claims;
CREATE TABLE bench_claims (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    status text NOT NULL DEFAULT 'pending',
    payload jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX bench_claims_pending_idx ON bench_claims (id) WHERE status = 'pending';
"""


PGBENCH_SCRIPT = Path(__file__).parent / "pgbench_claim.sql"


def pgbench_limit(url: str, *, batch: int, seconds: int, clients: int = 2) -> dict[str, Any]:
    per_second_guess = 30000 if batch > 1 else 8000
    rows = per_second_guess * seconds * 2
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(CLAIM_TABLE)
        conn.execute(
            "INSERT INTO bench_claims (status) SELECT 'pending' FROM generate_series(1, %s)",
            (rows,),
        )
        conn.execute("VACUUM ANALYZE bench_claims")
    cmd = [
        "pgbench",
        "-n",
        "-f",
        str(PGBENCH_SCRIPT),
        "-D",
        f"batch={batch}",
        "-T",
        str(seconds),
        "-c",
        str(clients),
        url,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    tps = float(match[1]) if match else float("nan")
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM bench_claims WHERE status = 'done'").fetchone()
        done = int(row[0]) if row else 0
        conn.execute("DROP TABLE bench_claims")
    return {
        "batch": batch,
        "clients": clients,
        "seconds": seconds,
        "tps": tps,
        "jobs_per_s": tps * batch,
        "done": done,
        "command": " ".join(cmd[:-1]).replace(str(PGBENCH_SCRIPT), "bench/pgbench_claim.sql")
        + " <db>",
    }


# -- the figure ------------------------------------------------------------------


def run(
    size: str = "small",
    runs: int = 3,
    *,
    names: list[str] | None = None,
    profile: bool = False,
    profile_concurrency: int = 50,
    pgbench: bool = True,
    n: int | None = None,
    procs: list[int] | None = None,
    concurrency: list[int] | None = None,
    sql: str | None = None,
    tag: str = "",
    out_dir: Path | None = None,
) -> dict[str, Any]:
    cfg = dict(SIZES[size])
    if n is not None:
        cfg["n"] = n
    if procs:
        cfg["procs"] = procs
    if concurrency:
        cfg["concurrency"] = concurrency
    chosen, skipped = systems(names or ["runlane", *PEERS])
    for name, why in skipped.items():
        print(f"skipping {name}: {why}", flush=True)
    trials: list[dict[str, Any]] = []
    limits: list[dict[str, Any]] = []
    profile_path: str | None = None
    sync = synchronous_commit()
    with bench_database("throughput") as url:
        for system in chosen:
            system.setup(url)
        if sql:
            # An experiment on the benchmark database (say, a trigger off).
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(sql)
        for rnd in range(runs):
            for nprocs in cfg["procs"]:
                for conc in cfg["concurrency"]:
                    for system in chosen:
                        result = trial(system, url, n=cfg["n"], procs=nprocs, concurrency=conc)
                        result["round"] = rnd
                        trials.append(result)
                        print(
                            f"round {rnd} {system.NAME:8} procs={nprocs} c={conc:3}:"
                            f" {result['jobs_per_s']:8.0f} jobs/s",
                            flush=True,
                        )
            if pgbench:
                for batch in cfg.get("pgbench_batches", (1, 10)):
                    limit = pgbench_limit(url, batch=batch, seconds=cfg["pgbench_seconds"])
                    limit["round"] = rnd
                    limits.append(limit)
                    print(f"round {rnd} pgbench batch={batch}: {limit['jobs_per_s']:.0f} jobs/s")
        if profile:
            folder = (out_dir or Path(__file__).parent / "results") / (
                f"profile_worker_c{profile_concurrency}_{sync}"
            )
            profile_path = str(folder)
            trial(
                runlane_system,
                url,
                n=cfg["n"],
                procs=1,
                concurrency=profile_concurrency,
                profile=profile_path,
            )
            time.sleep(0.5)
    summary = summarize(trials, limits, [m.NAME for m in chosen], cfg)
    data = {
        "size": size,
        "runs": runs,
        "n": cfg["n"],
        "skipped": skipped,
        "trials": trials,
        "pgbench": limits,
        "summary": summary,
        "profile": profile_path,
        "sql": sql,
    }
    write_results(f"throughput{tag}", data, out_dir=out_dir)
    make_plot(summary, cfg, synchronous_commit=sync, name=f"throughput{tag}", out_dir=out_dir)
    return data


def summarize(
    trials: list[dict[str, Any]],
    limits: list[dict[str, Any]],
    names: list[str],
    cfg: dict[str, Any],
) -> dict[str, Any]:
    rows = []
    batch_limit = median([x["jobs_per_s"] for x in limits if x["batch"] == 10])
    single_limit = median([x["jobs_per_s"] for x in limits if x["batch"] == 1])
    for procs in cfg["procs"]:
        for conc in cfg["concurrency"]:
            row: dict[str, Any] = {"procs": procs, "concurrency": conc}
            by_round: dict[int, dict[str, float]] = {}
            steady_by_round: dict[int, dict[str, float]] = {}
            for t in trials:
                if t["procs"] == procs and t["concurrency"] == conc:
                    by_round.setdefault(t["round"], {})[t["system"]] = t["jobs_per_s"]
                    steady_by_round.setdefault(t["round"], {})[t["system"]] = t["steady_jobs_per_s"]
            for name in names:
                row[name] = median([r[name] for r in by_round.values() if name in r])
                row[f"{name}_steady"] = median(
                    [r[name] for r in steady_by_round.values() if name in r]
                )
                cell = [
                    t
                    for t in trials
                    if t["system"] == name and t["procs"] == procs and t["concurrency"] == conc
                ]
                for column, key in CPU_COLUMNS.items():
                    row[f"{name}_{column}"] = median([t[key] for t in cell])
            peers = [n for n in names if n in PEERS]
            for variant in (n for n in names if n.startswith("runlane-")):
                row[f"{variant}_over_runlane"] = median(
                    [r[variant] / r["runlane"] for r in by_round.values() if variant in r]
                )
            if "runlane" in names and peers:
                row["ratio_vs_best_peer"] = ratio_vs_best_peer(by_round, peers)
                row["steady_ratio_vs_best_peer"] = ratio_vs_best_peer(steady_by_round, peers)
            if "runlane" in names and batch_limit == batch_limit:
                row["ratio_vs_pgbench_batch10"] = row["runlane"] / batch_limit
            rows.append(row)
    peer_names = [n for n in names if n in PEERS]
    variants = [n for n in names if n.startswith("runlane-")]
    headers = ["procs", "concurrency", *[f"{n} jobs/s" for n in names]]
    headers += [f"{v} / runlane" for v in variants]
    if peer_names and "runlane" in names:
        headers.append("runlane / best peer")
    headers.append("runlane / pgbench batch-10")
    headers += [f"{n} steady jobs/s" for n in names]
    if peer_names and "runlane" in names:
        headers.append("steady: runlane / best peer")
    table_rows = []
    for row in rows:
        cells = [row["procs"], row["concurrency"], *[row[n] for n in names]]
        cells += [row[f"{v}_over_runlane"] for v in variants]
        if peer_names and "runlane" in names:
            cells.append(row.get("ratio_vs_best_peer", float("nan")))
        cells.append(row.get("ratio_vs_pgbench_batch10", float("nan")))
        cells += [row[f"{n}_steady"] for n in names]
        if peer_names and "runlane" in names:
            cells.append(row.get("steady_ratio_vs_best_peer", float("nan")))
        table_rows.append(cells)
    table = print_table(headers, table_rows)
    print(f"pgbench limit: single-row {single_limit:.0f}/s, batch of 10 {batch_limit:.0f}/s")
    return {
        "names": names,
        "rows": rows,
        "table": table,
        "pgbench_single_jobs_per_s": single_limit,
        "pgbench_batch10_jobs_per_s": batch_limit,
    }


def ratio_vs_best_peer(by_round: dict[int, dict[str, float]], peers: list[str]) -> float:
    """The median over rounds of runlane's rate over the best peer's."""
    ratios = []
    for r in by_round.values():
        best = max((r[p] for p in peers if p in r), default=None)
        if best and "runlane" in r:
            ratios.append(r["runlane"] / best)
    return median(ratios)


def make_plot(
    summary: dict[str, Any],
    cfg: dict[str, Any],
    *,
    synchronous_commit: str,
    name: str = "throughput",
    out_dir: Path | None,
) -> None:
    # The burn-down rates are the rows' "{system}" keys, the steady ones
    # "{system}_steady"; the plot files take the same suffix.
    for suffix, what in (("", "burn-down"), ("_steady", "steady rate (10-90% done)")):
        series = {}
        for system in summary["names"]:
            for procs in cfg["procs"]:
                xs = [r["concurrency"] for r in summary["rows"] if r["procs"] == procs]
                ys = [r[f"{system}{suffix}"] for r in summary["rows"] if r["procs"] == procs]
                series[f"{system}, {procs} proc"] = (xs, ys)
        plot(
            f"{name}{suffix}",
            series,
            title=f"No-op {what}, N = {cfg['n']:,}, synchronous_commit={synchronous_commit}",
            xlabel="concurrency per worker process",
            ylabel="jobs per second",
            out_dir=out_dir,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--systems",
        default="runlane,pgqueuer,pgqueuer-asyncpg,oban,oban-unanalyzed",
        help="comma-separated: runlane,pgqueuer,pgqueuer-asyncpg,oban,oban-unanalyzed",
    )
    parser.add_argument("--profile", action="store_true", help="also profile a runlane worker")
    parser.add_argument(
        "--profile-concurrency", type=int, default=50, help="the profiled worker's concurrency"
    )
    parser.add_argument("--no-pgbench", action="store_true")
    parser.add_argument("--n", type=int, default=None, help="jobs per burn-down (overrides size)")
    parser.add_argument(
        "--procs", default=None, help="comma-separated worker process counts (overrides size)"
    )
    parser.add_argument(
        "--concurrency", default=None, help="comma-separated concurrencies (overrides size)"
    )
    parser.add_argument(
        "--sql", default=None, help="SQL run on the benchmark database first (experiments)"
    )
    parser.add_argument("--tag", default="", help="suffix of the results and plot names")


def main(args: argparse.Namespace) -> dict[str, Any]:
    return run(
        args.size,
        args.runs,
        names=[s.strip() for s in args.systems.split(",") if s.strip()],
        profile=args.profile,
        profile_concurrency=args.profile_concurrency,
        pgbench=not args.no_pgbench,
        n=args.n,
        procs=[int(x) for x in args.procs.split(",")] if args.procs else None,
        concurrency=[int(x) for x in args.concurrency.split(",")] if args.concurrency else None,
        sql=args.sql,
        tag=args.tag,
        out_dir=args.out_dir,
    )
