"""oban (Python, >= 0.7) running the same no-op workload, in the same server.

oban 0.7 needs Python >= 3.12 while runlane's venv may be older, so its
side runs under its own interpreter: ``RUNLANE_BENCH_OBAN_PYTHON``, else
the current interpreter when it can import oban, else
``~/.cache/runlane-bench/oban-venv/bin/python`` (made with
``python3.12 -m venv ~/.cache/runlane-bench/oban-venv &&
~/.cache/runlane-bench/oban-venv/bin/pip install 'oban>=0.7'``).

    <oban python> -m bench.peers.oban_adapter serve --url URL --concurrency 50

One Oban instance per process with queue ``default`` limited to the
concurrency; a psycopg pool of 20 connections.

``WITHOUT_STATISTICS`` (``oban-unanalyzed``) is the same system with
``oban_jobs``' planner statistics removed after the enqueue. The throughput
benchmark analyzes every system's queue table once its jobs are in (the
statistics a busy production table has), and those statistics, which see
no executing job, make oban 0.7's ack (one UPDATE per job, by id, state
and attempt time) read the state index from the first executing entry
instead of the primary key: each ack walks every job that has left the
executing state since, so the burn-down slows as it goes. Without them,
oban ran three times as fast (thirty-third session): this variant is the
peer at its best, so that runlane is compared with that.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    ROOT,
    Proc,
    add_at_rate,
    completion_marks,
    count,
    spawn,
    spawn_loader_process,
    system_variant,
)

NAME = "oban"
# Where the throughput benchmark's start gate takes its lock.
QUEUE_TABLE = "oban_jobs"
QUEUE = "default"
_VENV_PYTHON = Path.home() / ".cache" / "runlane-bench" / "oban-venv" / "bin" / "python"


def python() -> str | None:
    explicit = os.environ.get("RUNLANE_BENCH_OBAN_PYTHON")
    if explicit:
        return explicit
    if importlib.util.find_spec("oban") is not None:
        return sys.executable
    if _VENV_PYTHON.exists():
        return str(_VENV_PYTHON)
    return None


def available() -> str | None:
    exe = python()
    if exe is None:
        return "oban is not installed (it needs Python >= 3.12; see bench/peers/oban_adapter.py)"
    probe = subprocess.run([exe, "-c", "import oban"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"{exe} cannot import oban"
    return None


def _run_here(*args: str) -> None:
    exe = python()
    assert exe is not None
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    subprocess.run(
        [exe, "-m", "bench.peers.oban_adapter", *args], check=True, env=env, cwd=str(ROOT)
    )


def setup(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT to_regclass('public.oban_jobs') IS NOT NULL").fetchone()
    if not (row and row[0]):
        _run_here("install", "--url", url)


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE oban_jobs")


def enqueue(url: str, n: int) -> None:
    _run_here("enqueue", "--url", url, "--n", str(n))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE oban_jobs")


def enqueue_without_statistics(url: str, n: int) -> None:
    """enqueue, then the table as if never analyzed: no column statistics,
    no row count (removing statistics needs a superuser, as the
    benchmark's connection is)."""
    enqueue(url, n)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM pg_statistic WHERE starelid = 'oban_jobs'::regclass")
        conn.execute(
            "UPDATE pg_class SET reltuples = -1, relpages = 0 WHERE oid = 'oban_jobs'::regclass"
        )


def remaining(url: str) -> int:
    return count(url, "SELECT count(*) FROM oban_jobs WHERE state <> 'completed'")


def window(url: str) -> tuple[float, float]:
    """(first attempt, last completion) on the database clock, epoch seconds.
    oban stores UTC timestamps without a time zone."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            """
            SELECT extract(epoch FROM min(attempted_at) AT TIME ZONE 'UTC'),
                   extract(epoch FROM max(completed_at) AT TIME ZONE 'UTC')
            FROM oban_jobs
            """
        ).fetchone()
    assert row is not None and row[0] is not None and row[1] is not None
    return float(row[0]), float(row[1])


def steady_window(url: str, low: float, high: float) -> tuple[float, float]:
    """See bench.common.completion_marks (oban stores UTC without a zone)."""
    completed_at = "completed_at AT TIME ZONE 'UTC'"
    source = "oban_jobs WHERE completed_at IS NOT NULL"
    return completion_marks(url, completed_at, source, low, high)


def completed(url: str) -> int:
    """Jobs done so far (the wake-up figure's capacity under a loader)."""
    return count(url, "SELECT count(*) FROM oban_jobs WHERE state = 'completed'")


def spawn_loader(url: str, rate: float, *, tick_ms: float = 10.0) -> Proc:
    """A process (under the oban interpreter) adding ``rate`` no-op jobs/s
    through oban's own ``enqueue_many`` every ``tick_ms``, until stopped;
    it says ready once connected."""
    return spawn_loader_process(
        "bench.peers.oban_adapter", url, rate, tick_ms, name="oban loader", python=python()
    )


def spawn_worker(url: str, concurrency: int, *, mode: str = "noop") -> Proc:
    return spawn(
        "bench.peers.oban_adapter",
        ["serve", "--url", url, "--concurrency", str(concurrency), "--mode", mode],
        python=python(),
        name=f"oban worker c={concurrency} {mode}",
    )


def probe(url: str, n: int, gap: float) -> None:
    """Enqueues n jobs one at a time (under the oban interpreter), each
    carrying time.time() taken just before the call."""
    _run_here("probe", "--url", url, "--n", str(n), "--gap", str(gap))


# -- the oban side (runs under the oban interpreter) ---------------------------


LATENCIES: list[float] = []


def _worker_class() -> Any:
    from oban import worker

    @worker(queue=QUEUE)
    class NoopWorker:
        async def process(self, job: Any) -> None:
            started = time.time()
            if "t" in job.args:
                LATENCIES.append(started - float(job.args["t"]))

    return NoopWorker


async def _install(url: str) -> None:
    from oban import Oban
    from oban.schema import install

    pool = await Oban.create_pool(url, min_size=1, max_size=2)
    try:
        await install(pool)
    finally:
        await pool.close()


async def _enqueue(url: str, n: int) -> None:
    from oban import Oban

    noop = _worker_class()
    pool = await Oban.create_pool(url, min_size=1, max_size=2)
    try:
        oban = Oban(pool=pool)
        chunk = 2000
        for start in range(0, n, chunk):
            await oban.enqueue_many([noop.new({}) for _ in range(min(chunk, n - start))])
    finally:
        await pool.close()


async def _probe(url: str, n: int, gap: float) -> None:
    from oban import Oban

    noop = _worker_class()
    pool = await Oban.create_pool(url, min_size=1, max_size=2)
    try:
        oban = Oban(pool=pool)
        next_at = time.monotonic()
        for _ in range(n):
            await oban.enqueue(noop.new({"t": time.time()}))
            next_at += gap
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        await pool.close()


async def _load(url: str, rate: float, tick_ms: float) -> None:
    from oban import Oban

    noop = _worker_class()
    pool = await Oban.create_pool(url, min_size=1, max_size=2)
    try:
        oban = Oban(pool=pool)

        async def add(batch: int) -> None:
            # No "t" in the args: the stamping worker times only the probes.
            await oban.enqueue_many([noop.new({}) for _ in range(batch)])

        await add_at_rate(rate, tick_ms, add)
    finally:
        await pool.close()


async def _serve(url: str, concurrency: int, mode: str) -> None:
    from oban import Oban

    _worker_class()
    pool = await Oban.create_pool(url, min_size=2, max_size=20)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    oban = Oban(pool=pool, queues={QUEUE: concurrency})
    await oban.start()
    print("ready", flush=True)
    try:
        await stop.wait()
    finally:
        await oban.stop()
        await pool.close()
        if mode == "stamp":
            print(json.dumps({"latencies": LATENCIES}), flush=True)


WITHOUT_STATISTICS = system_variant(
    sys.modules[__name__], NAME="oban-unanalyzed", enqueue=enqueue_without_statistics
)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.oban_adapter")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("install", "enqueue", "serve", "probe", "load"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--url", required=True)
        cmd.add_argument("--n", type=int, default=0)
        cmd.add_argument("--gap", type=float, default=0.02)
        cmd.add_argument("--concurrency", type=int, default=10)
        cmd.add_argument("--mode", choices=["noop", "stamp"], default="noop")
        cmd.add_argument("--rate", type=float, default=0.0)
        cmd.add_argument("--tick-ms", type=float, default=10.0)
    args = parser.parse_args()
    if args.command == "install":
        asyncio.run(_install(args.url))
    elif args.command == "enqueue":
        asyncio.run(_enqueue(args.url, args.n))
    elif args.command == "load":
        asyncio.run(_load(args.url, args.rate, args.tick_ms))
    elif args.command == "probe":
        asyncio.run(_probe(args.url, args.n, args.gap))
    else:
        asyncio.run(_serve(args.url, args.concurrency, args.mode))


if __name__ == "__main__":
    main()
