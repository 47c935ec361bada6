"""A runlane worker process for the benchmarks.

    python -m bench.procs --url URL --concurrency 50 --mode noop

prints ``ready`` once the worker serves and runs until SIGTERM, and when it
has stopped a last line, a JSON object of its lease counts (``lease_counts``;
read back by ``read_lease_counts``). Modes (the agent is always ``bench``):

- ``noop``: returns None at once (throughput).
- ``stamp``: returns ``{"started": time.time(), "ended": time.time()}`` taken
  at the handler's start and end (wake-up latency, lane relay, recovery).
- ``hold``: sleeps for an hour (runs held by a worker that will be killed).
- ``events``: emits ``--events`` events ``{"t": time.time()}`` every
  ``--event-interval`` seconds, then returns (SSE delivery).

``--profile PATH`` runs the worker under pyinstrument and writes a text and
an HTML report when it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import signal
import time
from pathlib import Path
from typing import Any

from bench.common import AGENT
from runlane.app import App
from runlane.context import RunContext
from runlane.settings import Settings
from runlane.worker import Worker

# Events each run of the ``stream`` agent emits.
STREAM_EVENTS = 20


def build_app(mode: str, *, events: int = 5, event_interval: float = 1.0) -> App:
    app = App()

    if mode == "noop":

        @app.agent(AGENT)
        async def noop(ctx: RunContext) -> Any:
            return None

    elif mode == "stamp":

        @app.agent(AGENT)
        async def stamp(ctx: RunContext) -> Any:
            started = time.time()
            return {"started": started, "ended": time.time()}

    elif mode == "stream":

        @app.agent(AGENT)
        async def stream(ctx: RunContext) -> Any:
            # A streaming agent's shape: tokens emitted back to back.
            for i in range(STREAM_EVENTS):
                await ctx.emit("token", {"text": f"tok{i} "})
            return None

    elif mode == "hold":

        @app.agent(AGENT)
        async def hold(ctx: RunContext) -> Any:
            await asyncio.sleep(3600)

    elif mode == "events":

        @app.agent(AGENT)
        async def emit(ctx: RunContext) -> Any:
            # A random phase, so that the runs' events spread over the interval.
            await asyncio.sleep(random.uniform(0, event_interval))
            for i in range(events):
                if i:
                    await asyncio.sleep(event_interval)
                await ctx.emit("tick", {"i": i, "t": time.time()})
            return {"events": events}

    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return app


async def serve(args: argparse.Namespace) -> None:
    settings = Settings(
        database_url=args.url,
        lease_seconds=args.lease,
        heartbeat_seconds=args.heartbeat or args.lease / 3,
        poll_seconds=args.poll,
        reaper_interval_seconds=args.reaper,
        shutdown_grace_seconds=1.0,
    )
    app = build_app(args.mode, events=args.events, event_interval=args.event_interval)
    concurrency, batch_size = args.concurrency, args.batch_size
    worker = Worker(
        app,
        args.url,
        concurrency=concurrency,
        batch_size=batch_size,
        settings=settings,
        listen=not args.no_listen,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await worker.start()
    if worker.listener is not None:
        await asyncio.wait_for(worker.listener.connected.wait(), 30)
    print("ready", flush=True)
    await stop.wait()
    await worker.stop(grace_seconds=1.0)
    print(json.dumps(lease_counts(worker)), flush=True)


def lease_counts(worker: Worker) -> dict[str, float]:
    """What the worker's metrics counted of its leases: a lease lost under a
    benchmark's load is a run that may run twice, and worth a look."""
    sample = worker.metrics.registry.get_sample_value
    return {
        name: sample(f"runlane_worker_{name}_total") or 0.0
        for name in ("leases_lost", "lease_renewals", "heartbeat_failures")
    }


def read_lease_counts(out: str) -> dict[str, float]:
    """lease_counts from a worker's output after ``ready`` (empty if it
    printed none: killed, or a checkout's worker from before they were)."""
    lines = [line for line in out.splitlines() if line.startswith("{")]
    return dict(json.loads(lines[-1])) if lines else {}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.procs")
    parser.add_argument("--url", required=True)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--mode", default="noop")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="runs per claim (default: the concurrency)"
    )
    parser.add_argument("--lease", type=float, default=45.0)
    parser.add_argument("--heartbeat", type=float, default=None)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--reaper", type=float, default=10.0)
    parser.add_argument("--events", type=int, default=5)
    parser.add_argument("--event-interval", type=float, default=1.0)
    parser.add_argument("--no-listen", action="store_true")
    parser.add_argument("--profile", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(async_mode="disabled", interval=0.0005)
        profiler.start()
        try:
            asyncio.run(serve(args))
        finally:
            profiler.stop()
            path = Path(args.profile)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.with_suffix(".txt").write_text(
                profiler.output_text(unicode=False, color=False, show_all=False)
            )
            path.with_suffix(".html").write_text(profiler.output_html())
            Path(f"{path}_flat.txt").write_text(
                profiler.output_text(unicode=False, color=False, flat=True)
            )
    else:
        asyncio.run(serve(args))


if __name__ == "__main__":
    main()
