"""A lane submit's latency on an idle server: what one client waits for
``LaneService.submit`` (the call behind ``POST /v1/threads/{t}/requests``)
when nothing else runs, without HTTP.

    python -m bench.intake_latency [--n 300] [--runs 3] [--src OTHER_CHECKOUT/src] [--tag _s8]
                                   [--out-dir DIR]

Each round is a fresh process that submits ``--n`` requests, each to a new
thread (an idle lane, so each is dispatched at once), one every 20 ms, and
times each call. With ``--src``, rounds of this checkout and of the other
one alternate (a before/after comparison in the same minutes). No worker
runs. Results: ``bench/results/intake_latency{tag}.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import (
    AGENT,
    ROOT,
    bench_database,
    latency_summary,
    median,
    print_table,
    run_for_json,
    write_results,
)


async def submit(url: str, n: int, gap: float) -> list[float]:
    from runlane.database import create_pool
    from runlane.lane_service import LaneService
    from runlane.lane_store import LaneStore
    from runlane.service import RunService
    from runlane.settings import Settings
    from runlane.store import RunStore

    pool = create_pool(url, min_size=1, max_size=2)
    await pool.open()
    lanes = LaneService(LaneStore(pool), RunService(RunStore(pool), Settings(database_url=url)))
    prefix = uuid.uuid4().hex[:8]
    seconds = []
    try:
        for i in range(n):
            before = time.perf_counter()
            await lanes.submit(
                tenant="default",
                user_id="default",
                agent=AGENT,
                thread_id=f"{prefix}-{i}",
                input={},
            )
            seconds.append(time.perf_counter() - before)
            await asyncio.sleep(gap)
    finally:
        await pool.close()
    return seconds


def one_round(url: str, n: int, src: str) -> list[float]:
    values: list[float] = run_for_json(
        "bench.intake_latency", ["--serve", url, "--n", str(n)], src=src
    )
    return values


def run(
    n: int, runs: int, *, src: str | None = None, tag: str = "", out_dir: Path | None = None
) -> dict[str, Any]:
    systems = {"this checkout": str(ROOT / "src")}
    if src:
        systems["--src"] = src
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    with bench_database("intake_latency") as url:
        for rnd in range(runs):
            for name, path in systems.items():
                summary = latency_summary(one_round(url, n, path))
                rounds[name].append(summary)
                print(
                    f"round {rnd} {name}: p50 {summary['p50_ms']:.2f} ms,"
                    f" p99 {summary['p99_ms']:.2f} ms",
                    flush=True,
                )
    medians = {
        name: {key: median([r[key] for r in rs]) for key in ("p50_ms", "p90_ms", "p99_ms")}
        for name, rs in rounds.items()
    }
    table = print_table(
        ["code", "p50 ms", "p90 ms", "p99 ms"],
        [[name, m["p50_ms"], m["p90_ms"], m["p99_ms"]] for name, m in medians.items()],
    )
    data = {"n": n, "runs": runs, "src": src, "rounds": rounds, "medians": medians, "table": table}
    write_results(f"intake_latency{tag}", data, out_dir=out_dir)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.intake_latency")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--src", default=None, help="another checkout's src/, in alternate rounds")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out-dir", type=Path, default=None, help="default bench/results")
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        print(json.dumps(asyncio.run(submit(args.serve, args.n, 0.02))), flush=True)
        return
    run(args.n, args.runs, src=args.src, tag=args.tag, out_dir=args.out_dir)


if __name__ == "__main__":
    main()
