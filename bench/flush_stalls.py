"""Stalls of the disk's flush while a benchmark runs.

    python -m bench.flush_stalls --out PATH [--dir DIR]

A commit waits for its WAL to reach the disk. On the shared machines of
BENCHMARKS.md an 8 kB write's fdatasync takes 0.1-0.3 ms, but now and then
hundreds of milliseconds (once 1.9 s in the forty-seventh session), and
every transaction that commits meanwhile waits as long: the loaded
wake-up's worst rounds coincided with such stalls. This process writes and
flushes 8 kB every ``--interval-ms`` (100 flushes a second by default, a
small load beside a loaded database's thousands of commits a second) to a
file in ``--dir`` (the temporary directory by default, on the database's
disk on those machines; point it at the WAL's volume elsewhere), prints
``ready``, and at SIGTERM or SIGINT writes the flushes' count, median,
longest and every stall (a flush over ``STALL_MS``: its start on the wall
clock and its milliseconds) to ``--out`` as JSON. It runs as a process of
its own so that the benchmark's own pauses (its garbage collector's, say)
are not taken for the disk's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# A flush this long holds every commit made meanwhile past a 10 ms target.
STALL_MS = 20.0


@contextlib.contextmanager
def watching(interval_ms: float = 10.0) -> Iterator[dict[str, Any]]:
    """Watches the disk's flushes while the block runs; the dict it yields
    is filled on exit (``flushes``, ``p50_ms``, ``max_ms``, ``stall_ms``,
    ``stalls``), and left empty, with a warning, if the watcher reported
    nothing."""
    # Imported here: the watcher process itself needs none of it.
    from bench.common import spawn

    report: dict[str, Any] = {}
    fd, out = tempfile.mkstemp(prefix="runlane-bench-flush-stalls-", suffix=".json")
    os.close(fd)
    try:
        proc = spawn("bench.flush_stalls", ["--out", out, "--interval-ms", str(interval_ms)])
        try:
            proc.wait_ready()
            yield report
        finally:
            proc.stop()
            with contextlib.suppress(OSError, ValueError):
                report.update(json.loads(Path(out).read_text()))
            if not report:
                print("flush_stalls: the watcher reported nothing", file=sys.stderr)
    finally:
        os.unlink(out)


def watch(out: Path, interval_ms: float, directory: Path | None = None) -> None:
    """Flushes 8 kB every ``interval_ms`` in ``directory`` until SIGTERM or
    SIGINT, then writes the report to ``out``."""
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    block = os.urandom(8192)
    times: list[float] = []
    stalls: list[list[float]] = []
    fd, path = tempfile.mkstemp(prefix="runlane-bench-flush-", dir=directory)
    try:
        print("ready", flush=True)
        while not stopping:
            started_at = time.time()
            started = time.perf_counter()
            os.pwrite(fd, block, 0)
            os.fdatasync(fd)
            ms = (time.perf_counter() - started) * 1000
            times.append(ms)
            if ms > STALL_MS:
                stalls.append([round(started_at, 3), round(ms, 1)])
            time.sleep(interval_ms / 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    report = {
        "flushes": len(times),
        "p50_ms": round(statistics.median(times), 3) if times else None,
        "max_ms": round(max(times), 3) if times else None,
        "stall_ms": STALL_MS,
        "stalls": stalls,
    }
    out.write_text(json.dumps(report))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--interval-ms", type=float, default=10.0)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the flushed file goes (default: temp dir)"
    )
    args = parser.parse_args()
    watch(args.out, args.interval_ms, args.dir)


if __name__ == "__main__":
    main()
