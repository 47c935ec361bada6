"""What the API's run-change notifications cost a listening API process
while a worker burns down runs.

    python -m bench.run_changes_fanout [--n 20000] [--concurrency 200]
                                       [--listeners 2] [--runs 3]
                                       [--tag _s37] [--out-dir DIR]

Every API process holds one LISTEN connection (``EventHub``) for
``runlane_run_changes``, and PostgreSQL hands it every notification sent
on that channel, whether or not the process streams that run. Two
schemas alternate, round by round, each in a new database: ``per run``
(migrations up to 0046: the outcome write sends one notification per
ended run) and ``per batch`` (every migration: since 0047 one per
outcome batch, naming up to 200 runs). In each, ``--listeners``
processes run this checkout's ``EventHub`` with no subscriber, as an idle
API process would, and one worker process burns down ``--n`` no-op runs
(``bench.worker_cpu``, concurrency ``--concurrency``). Reported per 1,000
runs: the notifications each listener got, its process's CPU and its
backend's CPU (``/proc``, from just before the runs are enqueued to the
last one's end); and the worker's own CPU per run and the rate, from
``bench.worker_cpu``. Results: ``bench/results/run_changes_fanout{tag}.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    backend_pids,
    bench_database,
    median,
    print_table,
    process_cpu_seconds,
    run_for_json,
    spawn,
    wait_for,
    write_results,
)

# The last migration before the outcome write named its runs in batches.
PER_RUN_UP_TO = 46
SCHEMAS = {"per run": PER_RUN_UP_TO, "per batch": None}


async def listen(url: str) -> None:
    """An API process's hub with no subscriber, until SIGTERM; then prints
    its notifications and this process's CPU as JSON."""
    from runlane.database import create_pool
    from runlane.event_hub import EventHub

    pool = create_pool(url, min_size=0)  # never opened: no stream reads
    hub = EventHub(url, pool, reread_seconds=600)
    await hub.start()
    await asyncio.wait_for(hub.listener.connected.wait(), 30)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    await hub.stop()
    print(json.dumps({"notifications": hub.notifications, "cpu_s": time.process_time()}))


def one_measurement(up_to: int | None, n: int, concurrency: int, listeners: int) -> dict[str, Any]:
    from runlane.migrations import migrate

    with bench_database("fanout", runlane_schema=False) as url:
        migrate(url, up_to=up_to)
        procs = [
            spawn(
                "bench.run_changes_fanout",
                ["--listen", url],
                name=f"listener {i}",
            )
            for i in range(listeners)
        ]
        try:
            for proc in procs:
                proc.wait_ready()
            # Before the worker starts, the listeners' are the database's
            # only client backends (their hubs' pools are never opened),
            # once any other has ended (a third was seen once in CI: the
            # migration's connection still leaving, it seems).
            backends: list[int] = []

            def listeners_alone() -> bool:
                backends[:] = backend_pids(url)
                return len(backends) == listeners

            wait_for(listeners_alone, timeout=30, what=f"{listeners} listening backends alone")
            procs_before = [proc.cpu_seconds() for proc in procs]
            backends_before = [process_cpu_seconds(pid) for pid in backends]
            worker = run_for_json(
                "bench.worker_cpu",
                ["--serve", url, "--n", str(n), "--concurrency", str(concurrency)],
                src=str(ROOT / "src"),
            )
            backends_cpu = [
                process_cpu_seconds(pid) - before
                for pid, before in zip(backends, backends_before, strict=True)
            ]
            procs_cpu = [
                proc.cpu_seconds() - before
                for proc, before in zip(procs, procs_before, strict=True)
            ]
        finally:
            outs = [proc.stop_and_read() for proc in procs]
    heard = [json.loads(out.strip().splitlines()[-1])["notifications"] for out in outs]
    per_thousand = 1000 / n
    return {
        "notifications_per_1000_runs": median(heard) * per_thousand,
        "listener_cpu_ms_per_1000_runs": median(procs_cpu) * 1000 * per_thousand,
        "listener_backend_cpu_ms_per_1000_runs": median(backends_cpu) * 1000 * per_thousand,
        "worker_cpu_us_per_run": worker["worker_cpu_us_per_run"],
        "runs_per_s": worker["runs_per_s"],
    }


COLUMNS = (
    "notifications_per_1000_runs",
    "listener_cpu_ms_per_1000_runs",
    "listener_backend_cpu_ms_per_1000_runs",
    "worker_cpu_us_per_run",
    "runs_per_s",
)


def run(
    n: int,
    concurrency: int,
    listeners: int,
    runs: int,
    *,
    tag: str = "",
    out_dir: Path | None = None,
) -> dict[str, Any]:
    trials: list[dict[str, Any]] = []
    for rnd in range(runs):
        for schema, up_to in SCHEMAS.items():
            result = one_measurement(up_to, n, concurrency, listeners)
            trials.append({"round": rnd, "schema": schema, **result})
            print(
                f"round {rnd} {schema}: "
                + ", ".join(f"{key} {result[key]:.1f}" for key in COLUMNS),
                flush=True,
            )
    medians = {
        schema: {key: median([t[key] for t in trials if t["schema"] == schema]) for key in COLUMNS}
        for schema in SCHEMAS
    }
    table = print_table(
        [
            "the outcome write notifies",
            "per listener, per 1,000 runs: notifications",
            "listener process CPU ms",
            "listener backend CPU ms",
            "worker CPU us/run",
            "runs/s",
        ],
        [[schema, *(medians[schema][key] for key in COLUMNS)] for schema in SCHEMAS],
    )
    data = {
        "n": n,
        "concurrency": concurrency,
        "listeners": listeners,
        "runs": runs,
        "trials": trials,
        "medians": medians,
        "table": table,
    }
    write_results(f"run_changes_fanout{tag}", data, out_dir=out_dir)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.run_changes_fanout")
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--listeners", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--listen", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.listen:
        asyncio.run(listen(args.listen))
        return
    run(
        args.n,
        args.concurrency,
        args.listeners,
        args.runs,
        tag=args.tag,
        out_dir=args.out_dir,
    )


if __name__ == "__main__":
    main()
