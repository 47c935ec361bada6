"""Where an idle worker's wake-up time goes: submit → NOTIFY → claim →
handler, with timestamps taken inside the worker process.

    python -m bench.wakeup_breakdown [--n 300] [--src OTHER_CHECKOUT/src] [--tag _base]

A worker (concurrency 10) runs with its ``Listener`` handler and
``RunStore.claim_batch`` wrapped to stamp ``time.time()`` when the wake-up
NOTIFY arrives and when the claim is sent and answered; the handler stamps
its start. This process submits ``--n`` runs through ``RunService.submit``,
one every 20 ms, stamping before and after each call. ``--src`` runs the
worker of another checkout (a before/after comparison). Results:
``bench/results/wakeup_breakdown{tag}.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from typing import Any

from bench.common import AGENT, ROOT, bench_database, latency_summary, print_table, write_results


async def serve(url: str) -> None:
    from runlane.app import App
    from runlane.settings import Settings
    from runlane.worker import Worker

    marks: dict[str, dict[str, float]] = {}
    app = App()

    @app.agent(AGENT)
    async def stamp(ctx: Any) -> Any:
        marks.setdefault(str(ctx.run_id), {})["handler"] = time.time()
        return None

    worker = Worker(app, url, concurrency=10, settings=Settings(database_url=url))
    last_notify = [0.0]
    on_notify = worker._on_notify

    def stamped(channel: str, payload: str) -> None:
        if channel == "runlane_wakeup":
            last_notify[0] = time.time()
        on_notify(channel, payload)

    assert worker.listener is not None
    worker.listener._handler = stamped
    claim = worker.store.claim_batch

    async def stamped_claim(**kwargs: Any) -> Any:
        sent = time.time()
        rows = await claim(**kwargs)
        done = time.time()
        for c in rows:
            marks.setdefault(str(c.run.id), {}).update(
                notify=last_notify[0], claim_sent=sent, claim_done=done
            )
        return rows

    worker.store.claim_batch = stamped_claim  # type: ignore[method-assign]
    await worker.start()
    await asyncio.wait_for(worker.listener.connected.wait(), 30)
    print("ready", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await worker.stop(1.0)
    print(json.dumps(marks), flush=True)


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
            run, _ = await service.submit(AGENT, {})
            stamps[str(run.id)] = (before, time.time())
            await asyncio.sleep(gap)
    finally:
        await pool.close()
    return stamps


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wakeup_breakdown")
    parser.add_argument("--n", type=int, default=300)
    parser.add_argument("--src", default=None, help="another checkout's src/ for the worker")
    parser.add_argument("--tag", default="")
    parser.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.serve))
        return
    with bench_database("wakeup_breakdown") as url:
        env_path = f"{ROOT}:{args.src or ROOT / 'src'}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.wakeup_breakdown", "--serve", url],
            stdout=subprocess.PIPE,
            text=True,
            cwd=str(ROOT),
            env={**__import__("os").environ, "PYTHONPATH": env_path},
        )
        assert proc.stdout is not None
        try:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("the worker did not start")
            time.sleep(1.0)
            stamps = asyncio.run(submit(url, args.n, 0.02))
            time.sleep(1.0)
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
    marks = json.loads(out.strip().splitlines()[-1])
    parts: dict[str, list[float]] = {
        "submit call (INSERT + NOTIFY + commit)": [],
        "submit start -> NOTIFY received": [],
        "NOTIFY received -> claim sent": [],
        "claim round trip": [],
        "claim answered -> handler start": [],
        "submit start -> handler start": [],
    }
    for run_id, (before, after) in stamps.items():
        m = marks.get(run_id)
        if not m or "claim_sent" not in m or "handler" not in m:
            continue
        values = [
            after - before,
            m["notify"] - before,
            m["claim_sent"] - m["notify"],
            m["claim_done"] - m["claim_sent"],
            m["handler"] - m["claim_done"],
            m["handler"] - before,
        ]
        for key, value in zip(parts, values, strict=True):
            parts[key].append(value)
    summary = {key: latency_summary(values) for key, values in parts.items()}
    table = print_table(
        ["part", "p50 ms", "p90 ms", "p99 ms"],
        [[k, v["p50_ms"], v["p90_ms"], v["p99_ms"]] for k, v in summary.items()],
    )
    write_results(
        f"wakeup_breakdown{args.tag}",
        {"n": args.n, "worker_src": args.src or "this checkout", "parts": summary, "table": table},
    )


if __name__ == "__main__":
    main()
