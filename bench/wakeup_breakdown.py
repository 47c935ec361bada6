"""Where an idle worker's wake-up time goes, with timestamps taken inside
the worker process.

    python -m bench.wakeup_breakdown [--n 300] [--gap-ms 20] [--src OTHER/src] [--tag _base]
                                     [--load-rate R] [--concurrency C]

A worker (concurrency 10, or ``--concurrency``) runs with its ``Listener`` handler and
``RunStore.claim`` wrapped to stamp ``time.time()`` when a NOTIFY
arrives and when a claim is sent and answered; the handler stamps its
start. This process submits ``--n`` runs through ``RunService.submit``,
one every ``--gap-ms`` (20 ms), stamping before and after each call. An idle worker's
runs arrive one of two ways, reported apart:

- pushed (standing claims, migration 0025): the submit claims the run for
  the parked worker and its ``runlane_push`` NOTIFY carries it: submit →
  push received → handler start;
- claimed (the pull path, or a worker that was not parked): submit →
  ``runlane_wakeup`` received → claim sent → claim answered → handler.

``--src`` runs the worker of another checkout (a before/after
comparison). Results: ``bench/results/wakeup_breakdown{tag}.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.common import (
    AGENT,
    ROOT,
    bench_database,
    latency_summary,
    print_table,
    running,
    write_results,
)
from bench.wakeup import spawn_loader


async def serve(url: str, concurrency: int) -> None:
    from runlane.app import App
    from runlane.settings import Settings
    from runlane.worker import Worker

    marks: dict[str, dict[str, float]] = {}
    app = App()

    @app.agent(AGENT)
    async def stamp(ctx: Any) -> Any:
        # Only the probes are stamped: the loader's runs (--load-rate)
        # carry no "probe" key.
        if "probe" in ctx.input:
            marks.setdefault(str(ctx.run_id), {})["handler"] = time.time()
        return None

    worker = Worker(app, url, concurrency=concurrency, settings=Settings(database_url=url))
    last_notify = [0.0]
    # (arrived, taken, payload) of each push: the payload is read for its
    # run's id at the end, so that no decoding of the bench's own is timed.
    pushes: list[tuple[float, float, str]] = []
    on_notify = worker._on_notify

    def stamped(channel: str, payload: str) -> None:
        now = time.time()
        if channel == "runlane_wakeup":
            last_notify[0] = now
        on_notify(channel, payload)
        if channel == "runlane_push":
            pushes.append((now, time.time(), payload))

    assert worker.listener is not None
    worker.listener._handler = stamped
    claim = worker.store.claim

    # (sent, answered, runs taken, runs held before) of every claim.
    claims: list[tuple[float, float, int, int]] = []

    async def stamped_claim(spec: Any) -> Any:
        sent = time.time()
        held = len(worker.executions)
        rows = await claim(spec)
        done = time.time()
        claims.append((sent, done, len(rows), held))
        for c in rows:
            if "probe" in c.input:
                marks.setdefault(str(c.id), {}).update(
                    notify=last_notify[0], claim_sent=sent, claim_done=done
                )
        return rows

    worker.store.claim = stamped_claim  # type: ignore[method-assign]
    await worker.start()
    await asyncio.wait_for(worker.listener.connected.wait(), 30)
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await worker.stop(1.0)
    for arrived, taken, payload in pushes:
        message = json.loads(payload)
        # Only a payload that carries the run (the claim's columns, its id
        # first) has it taken in _on_push; one that names it is read later.
        run_id = message["claim"][0] if "claim" in message else None
        if run_id is not None:
            marks.setdefault(str(run_id), {}).update(push=arrived, taken=taken)
    reported = {"marks": marks, "claims": claims, "concurrency": worker.concurrency}
    print(json.dumps(reported), flush=True)


async def submit(url: str, n: int, gap: float) -> dict[str, tuple[float, float]]:
    from runlane.database import create_pool
    from runlane.service import RunService
    from runlane.settings import Settings
    from runlane.store import RunStore

    # The API's pool check (no round trip at checkout), as the peers' probes
    # (PGQueuer's connection, oban's pool) send none; until the ninth
    # session every probe paid a check round trip first.
    pool = create_pool(url, min_size=1, max_size=2, check="quiet")
    await pool.open()
    service = RunService(RunStore(pool), Settings(database_url=url))
    stamps = {}
    try:
        for _ in range(n):
            before = time.time()
            run, _ = await service.submit(AGENT, {"probe": True})
            stamps[str(run.id)] = (before, time.time())
            await asyncio.sleep(gap)
    finally:
        await pool.close()
    return stamps


def run(
    n: int,
    gap_ms: float = 20.0,
    *,
    src: str | None = None,
    tag: str = "",
    out_dir: Path | None = None,
    load_rate: float | None = None,
    concurrency: int = 10,
) -> dict[str, Any]:
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    with bench_database("wakeup_breakdown") as url:
        env_path = f"{ROOT}:{src or ROOT / 'src'}"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.wakeup_breakdown",
                "--serve",
                url,
                "--concurrency",
                str(concurrency),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=str(ROOT),
            env={**os.environ, "PYTHONPATH": env_path},
        )
        assert proc.stdout is not None
        try:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("the worker did not start")
            loaders = [spawn_loader(url, load_rate)] if load_rate else []
            with running(loaders):
                for loader in loaders:
                    loader.wait_ready()
                time.sleep(1.0)
                stamps = asyncio.run(submit(url, n, gap_ms / 1000.0))
            time.sleep(1.0)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
    reported = json.loads(out.strip().splitlines()[-1])
    marks, claims = reported["marks"], reported["claims"]
    # "pushed: ..." and "claimed: ..." parts, each run's in the order listed.
    parts: dict[str, list[float]] = defaultdict(list)
    counts = {"pushed": 0, "claimed": 0}
    # Every probe's wake-up, whichever way its run arrived: the target's figure.
    every: list[float] = []
    for run_id, (before, after) in stamps.items():
        m = marks.get(run_id)
        if not m or "handler" not in m:
            continue
        if "push" in m:
            kind, values = (
                "pushed",
                {
                    "submit call (INSERT + claim + NOTIFY + commit)": after - before,
                    "submit start -> push received": m["push"] - before,
                    "push received -> run taken (decoded, task made)": m["taken"] - m["push"],
                    "run taken -> handler start": m["handler"] - m["taken"],
                    "submit start -> handler start": m["handler"] - before,
                },
            )
        elif "claim_sent" in m:
            kind, values = (
                "claimed",
                {
                    "submit call (INSERT + NOTIFY + commit)": after - before,
                    "submit start -> NOTIFY received": m["notify"] - before,
                    "NOTIFY received -> claim sent": m["claim_sent"] - m["notify"],
                    "claim round trip": m["claim_done"] - m["claim_sent"],
                    "claim answered -> handler start": m["handler"] - m["claim_done"],
                    "submit start -> handler start": m["handler"] - before,
                },
            )
        else:
            continue
        counts[kind] += 1
        every.append(m["handler"] - before)
        for label, value in values.items():
            parts[f"{kind}: {label}"].append(value)
    # Pushed runs' parts first (a stable sort keeps each kind's order).
    parts = dict(sorted(parts.items(), key=lambda item: not item[0].startswith("pushed")))
    summary = {key: latency_summary(values) for key, values in parts.items()}
    # The claims sent while the probes went in (the loader's too).
    first = min(before for before, _ in stamps.values())
    last = max(after for _, after in stamps.values())
    window = [c for c in claims if first <= c[0] <= last]
    claim_summary = {
        "claims": len(window),
        "claims_per_s": len(window) / (last - first) if last > first else 0.0,
        "runs_taken_mean": sum(c[2] for c in window) / len(window) if window else 0.0,
        "runs_taken_max": max((c[2] for c in window), default=0),
        "runs_held_before_max": max((c[3] for c in window), default=0),
        "round_trip": latency_summary([c[1] - c[0] for c in window]),
    }
    every_summary = latency_summary(every)
    print(f"runs pushed: {counts['pushed']}, claimed: {counts['claimed']}")
    print(
        "every probe, submit start -> handler start:"
        f" p50 {every_summary['p50_ms']:.2f} ms, p99 {every_summary['p99_ms']:.2f} ms"
    )
    print(f"claims while probing: {json.dumps(claim_summary)}")
    table = print_table(
        ["part", "p50 ms", "p90 ms", "p99 ms"],
        [[k, v["p50_ms"], v["p90_ms"], v["p99_ms"]] for k, v in summary.items()],
    )
    data = {
        "n": n,
        "gap_ms": gap_ms,
        "worker_src": src or "this checkout",
        "load_rate": load_rate,
        "concurrency": reported["concurrency"],
        "runs": counts,
        "every_probe": every_summary,
        "parts": summary,
        "claims_while_probing": claim_summary,
        "table": table,
    }
    path = write_results(f"wakeup_breakdown{tag}", data, out_dir=out_dir)
    print(f"results: {path}")
    return data


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wakeup_breakdown")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=20.0, help="quiet before each submit")
    parser.add_argument("--src", default=None, help="another checkout's src/ for the worker")
    parser.add_argument(
        "--load-rate",
        type=float,
        default=None,
        help="runs/s a loader adds meanwhile (bench.wakeup's loader, batches every 10 ms)",
    )
    parser.add_argument(
        "--concurrency", type=int, default=10, help="the worker's concurrency (default 10)"
    )
    parser.add_argument("--tag", default="")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    if args.serve:
        asyncio.run(serve(args.serve, args.concurrency))
        return
    run(
        args.n,
        args.gap_ms,
        src=args.src,
        tag=args.tag,
        out_dir=args.out_dir,
        load_rate=args.load_rate,
        concurrency=args.concurrency,
    )


if __name__ == "__main__":
    main()
