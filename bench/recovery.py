"""Figure 7: recovery — time from a worker's SIGKILL to its runs being
taken over by another worker, against the lease setting.

Worker A (mode ``hold``) claims H runs and holds them; worker B (mode
``stamp``, reaper every ``--reaper`` s) stands by. A is SIGKILLed; two
times are read for every run, from the kill: *reaped* (its attempt row
ends ``lease_expired``: the lease ran out and the reaper returned the run to
pending) and *restarted* (B's handler started it). Between the two lies
the retry backoff that runlane applies to every reaped attempt
(``runlane.backoff_seconds``: 5 s x 0.9-1.1 after a first attempt) plus
the poll interval (reaped runs send no wake-up).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import psycopg

from bench import runlane_system
from bench.common import (
    bench_database,
    median,
    plot,
    print_table,
    running,
    wait_for,
    write_results,
)

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"leases": [1.0], "held": 3},
    "small": {"leases": [2.0, 5.0], "held": 20},
    "full": {"leases": [2.0, 5.0, 10.0], "held": 20},
}


def trial(url: str, lease: float, held: int, reaper: float, poll: float) -> dict[str, Any]:
    runlane_system.reset(url)
    runlane_system.enqueue(url, held)
    extra = ["--lease", str(lease), "--reaper", str(reaper), "--poll", str(poll)]
    holder = runlane_system.spawn_worker(url, held, mode="hold", extra=extra)
    try:
        holder.wait_ready()
        wait_for(
            lambda: runlane_system.count_runs(url, ("running",)) == held,
            timeout=30,
            what="runs held",
        )
        standby = runlane_system.spawn_worker(url, held, mode="stamp", extra=extra)
        with running([standby]):
            standby.wait_ready()
            time.sleep(lease / 2)  # mid-lease: a heartbeat has renewed meanwhile
            killed_at = time.time()
            holder.kill()
            wait_for(
                lambda: runlane_system.completed(url) == held,
                timeout=lease + reaper + 30,
                what="runs taken over",
            )
    finally:
        holder.kill()
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            """
            SELECT extract(epoch FROM a.ended_at), (r.output ->> 'started')::float8
            FROM runlane.runs AS r
            JOIN runlane.attempts AS a ON a.run_id = r.id AND a.attempt = 1
            WHERE a.outcome = 'lease_expired'
            """
        ).fetchall()
    reaped = [float(r[0]) - killed_at for r in rows]
    restarted = [float(r[1]) - killed_at for r in rows]
    return {
        "lease": lease,
        "runs": len(rows),
        "reaped_median_s": median(reaped),
        "reaped_max_s": max(reaped),
        "restarted_median_s": median(restarted),
        "restarted_max_s": max(restarted),
    }


def run(
    size: str = "small",
    runs: int = 3,
    *,
    reaper: float = 1.0,
    poll: float = 1.0,
    out_dir: Path | None = None,
) -> dict[str, Any]:
    cfg = SIZES[size]
    trials: list[dict[str, Any]] = []
    with bench_database("recovery") as url:
        for rnd in range(runs):
            for lease in cfg["leases"]:
                result = trial(url, lease, cfg["held"], reaper, poll)
                result["round"] = rnd
                trials.append(result)
                print(
                    f"round {rnd} lease {lease}s: reaped after {result['reaped_median_s']:.2f} s"
                    f" (max {result['reaped_max_s']:.2f}), restarted after"
                    f" {result['restarted_median_s']:.2f} s (max {result['restarted_max_s']:.2f})",
                    flush=True,
                )
    rows = []
    for lease in cfg["leases"]:
        mine = [t for t in trials if t["lease"] == lease]
        rows.append(
            {
                "lease": lease,
                "heartbeat": lease / 3,
                "reaped_median_s": median([t["reaped_median_s"] for t in mine]),
                "reaped_max_s": median([t["reaped_max_s"] for t in mine]),
                "restarted_median_s": median([t["restarted_median_s"] for t in mine]),
                "restarted_max_s": median([t["restarted_max_s"] for t in mine]),
            }
        )
    table = print_table(
        [
            "lease s",
            "heartbeat s",
            "reaped, median s",
            "reaped, max s",
            "restarted, median s",
            "restarted, max s",
        ],
        [
            [
                r["lease"],
                r["heartbeat"],
                r["reaped_median_s"],
                r["reaped_max_s"],
                r["restarted_median_s"],
                r["restarted_max_s"],
            ]
            for r in rows
        ],
    )
    leases = [r["lease"] for r in rows]
    plot(
        "recovery",
        {
            "reaped (lease ran out, reaper returned it)": (
                leases,
                [r["reaped_median_s"] for r in rows],
            ),
            "restarted by the other worker": (leases, [r["restarted_median_s"] for r in rows]),
            "restarted, slowest run": (leases, [r["restarted_max_s"] for r in rows]),
        },
        title=f"SIGKILL to takeover (reaper every {reaper:g} s, poll {poll:g} s; median)",
        xlabel="lease_seconds (heartbeat = lease / 3)",
        ylabel="seconds after SIGKILL",
        out_dir=out_dir,
    )
    data = {
        "size": size,
        "runs": runs,
        "config": {**cfg, "reaper_interval_s": reaper, "poll_s": poll},
        "trials": trials,
        "summary": {"rows": rows, "table": table},
    }
    write_results("recovery", data, out_dir=out_dir)
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--reaper", type=float, default=1.0, help="reaper interval, seconds")
    parser.add_argument("--poll", type=float, default=1.0, help="poll interval, seconds")


def main(args: argparse.Namespace) -> dict[str, Any]:
    return run(args.size, args.runs, reaper=args.reaper, poll=args.poll, out_dir=args.out_dir)
