"""The worker's own CPU per run: what one worker process spends in Python
(claiming, decoding, running, batching outcomes) for each no-op run.

    python -m bench.worker_cpu [--n 20000] [--concurrency 50,200] [--runs 3]
                               [--mode noop|stamp] [--src OTHER_CHECKOUT/src]
                               [--tag _s11] [--out-dir DIR]

Each measurement is a fresh process that starts a ``Worker`` (the
``noop`` agent of bench.procs, NOTIFY on), enqueues ``--n`` runs in bulk,
and reads its own CPU time (``time.process_time``) from the moment the
runs are there until the last one is completed, waiting on a connection of
its own. Unlike the throughput figure it splits off nothing by guess: the
worker is the only thing in that process. With ``--src``, this checkout's
worker and the other checkout's alternate, measurement by measurement, in
the same database (a before/after in the same minutes). ``--mode stamp``
runs bench.procs' ``stamp`` agent instead, whose runs return an output
(two timestamps), as most real handlers do: the outcome batches then carry
a JSON value per run. Results:
``bench/results/worker_cpu{tag}.json``. The garbage collector's part is
timed through ``gc.callbacks`` over the same window: collections of each
generation (young, middle, full) and their CPU per run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    bench_database,
    median,
    print_table,
    run_for_json,
    write_results,
)


class CollectorClock:
    """Collections of each generation, and the CPU they took, while it is
    in ``gc.callbacks``: what the garbage collector costs the worker."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            generation = info["generation"]
            self.collections[generation] += 1
            self.seconds[generation] += time.process_time() - self._started


async def burn_down(url: str, n: int, concurrency: int, mode: str = "noop") -> dict[str, Any]:
    import gc

    import psycopg

    from bench.procs import build_app
    from bench.runlane_system import enqueue, window
    from runlane.settings import Settings
    from runlane.worker import Worker

    settings = Settings(
        database_url=url,
        lease_seconds=45.0,
        heartbeat_seconds=15.0,
        poll_seconds=1.0,
        reaper_interval_seconds=10.0,
        shutdown_grace_seconds=1.0,
    )
    worker = Worker(build_app(mode), url, concurrency=concurrency, settings=settings)
    await worker.start()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as watch:
        try:
            if worker.listener is not None:
                await asyncio.wait_for(worker.listener.connected.wait(), 30)
            # Blocks the loop while it inserts: the worker starts on them after.
            enqueue(url, n)
            collector = CollectorClock()
            gc.callbacks.append(collector)
            cpu_before = time.process_time()
            while True:
                cur = await watch.execute(
                    "SELECT count(*) FROM runlane.runs WHERE status <> 'completed'"
                )
                row = await cur.fetchone()
                if row is not None and row[0] == 0:
                    break
                await asyncio.sleep(0.05)
            cpu = time.process_time() - cpu_before
            gc.callbacks.remove(collector)
            cur = await watch.execute("SELECT count(*) FROM runlane.run_events")
            events = await cur.fetchone()
        finally:
            await worker.stop(grace_seconds=1.0)
    # The rate over the database's window (first claim to last finish): the
    # worker finds the runs at its next poll, up to a second after the insert.
    first, last = window(url)
    return {
        "worker_cpu_us_per_run": cpu / n * 1e6,
        "runs_per_s": n / (last - first),
        # Events the handlers emitted (--mode stream), per run.
        "events_per_run": (events[0] if events is not None else 0) / n,
        # Young, middle and full collections, and their CPU per run.
        "gc_collections": collector.collections,
        "gc_us_per_run": [seconds / n * 1e6 for seconds in collector.seconds],
    }


def one_measurement(
    url: str, n: int, concurrency: int, src: str, mode: str = "noop"
) -> dict[str, Any]:
    from bench.runlane_system import reset

    reset(url)
    result: dict[str, Any] = run_for_json(
        "bench.worker_cpu",
        ["--serve", url, "--n", str(n), "--concurrency", str(concurrency), "--mode", mode],
        src=src,
    )
    return result


def run(
    n: int,
    concurrencies: list[int],
    runs: int,
    *,
    src: str | None = None,
    tag: str = "",
    out_dir: Path | None = None,
    mode: str = "noop",
) -> dict[str, Any]:
    codes = {"this checkout": str(ROOT / "src")}
    if src:
        codes["--src"] = src
    trials: list[dict[str, Any]] = []
    with bench_database("worker_cpu") as url:
        for rnd in range(runs):
            for concurrency in concurrencies:
                for code, path in codes.items():
                    result = one_measurement(url, n, concurrency, path, mode)
                    trials.append(
                        {"round": rnd, "code": code, "concurrency": concurrency, **result}
                    )
                    print(
                        f"round {rnd} c={concurrency} {code}:"
                        f" {result['worker_cpu_us_per_run']:.1f} us/run,"
                        f" {result['runs_per_s']:.0f} runs/s,"
                        f" {sum(result['gc_us_per_run']):.1f} us/run in"
                        f" {sum(result['gc_collections'])} collections",
                        flush=True,
                    )
    rows = []
    medians: dict[str, dict[str, float]] = {}
    for concurrency in concurrencies:
        for code in codes:
            mine = [t for t in trials if t["code"] == code and t["concurrency"] == concurrency]
            cpu = median([t["worker_cpu_us_per_run"] for t in mine])
            rate = median([t["runs_per_s"] for t in mine])
            gc_cpu = median([sum(t["gc_us_per_run"]) for t in mine])
            collections = median([sum(t["gc_collections"]) for t in mine])
            medians[f"{code} c={concurrency}"] = {
                "worker_cpu_us_per_run": cpu,
                "runs_per_s": rate,
                "gc_us_per_run": gc_cpu,
                "gc_collections": collections,
            }
            rows.append([code, concurrency, cpu, rate, gc_cpu, collections])
    table = print_table(
        [
            "code",
            "concurrency",
            "worker CPU us/run",
            "runs/s",
            "of it in the garbage collector, us/run",
            "collections",
        ],
        rows,
    )
    data = {
        "n": n,
        "concurrency": concurrencies,
        "runs": runs,
        "src": src,
        "mode": mode,
        "trials": trials,
        "medians": medians,
        "table": table,
    }
    write_results(f"worker_cpu{tag}", data, out_dir=out_dir)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_cpu")
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--concurrency", default="50,200", help="comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--src", default=None, help="another checkout's src/, alternating")
    parser.add_argument(
        "--mode",
        choices=["noop", "stamp", "stream"],
        default="noop",
        help="stamp: each run returns an output (two timestamps);"
        " stream: each run emits bench.procs.STREAM_EVENTS events back to back",
    )
    parser.add_argument("--tag", default="")
    parser.add_argument("--out-dir", type=Path, default=None, help="default bench/results")
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    if args.serve:
        result = asyncio.run(burn_down(args.serve, args.n, concurrencies[0], args.mode))
        print(json.dumps(result), flush=True)
        return
    run(
        args.n,
        concurrencies,
        args.runs,
        src=args.src,
        tag=args.tag,
        out_dir=args.out_dir,
        mode=args.mode,
    )


if __name__ == "__main__":
    main()
