"""Stalls of the disk's flush while a benchmark runs.

    python -m bench.flush_stalls --out PATH

A commit waits for its WAL to reach the disk. On the shared machines of
BENCHMARKS.md an 8 kB write's fdatasync takes about 0.1 ms, but now and
then hundreds of milliseconds (once 1.9 s in the forty-seventh session),
and every transaction that commits meanwhile waits as long: the loaded
wake-up's worst rounds were such stalls, not runlane's work. This process
writes and flushes 8 kB every ``--interval-ms`` to a file in the temporary
directory (the disk the database shares on those machines), prints
``ready``, and at SIGTERM writes the flushes' count, median, longest and
every stall (a flush over ``STALL_MS``: its start on the wall clock and its
milliseconds) to ``--out`` as JSON. It runs as a process of its own so
that the benchmark's own pauses (its garbage collector's, say) are not
taken for the disk's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import spawn

# A flush this long holds every commit made meanwhile past a 10 ms target.
STALL_MS = 20.0


@contextlib.contextmanager
def watching(interval_ms: float = 10.0) -> Iterator[dict[str, Any]]:
    """Watches the disk's flushes while the block runs; the dict it yields
    is filled on exit (``flushes``, ``p50_ms``, ``max_ms``, ``stalls``)."""
    report: dict[str, Any] = {}
    fd, out = tempfile.mkstemp(prefix="runlane-bench-flush-stalls-", suffix=".json")
    os.close(fd)
    proc = spawn("bench.flush_stalls", ["--out", out, "--interval-ms", str(interval_ms)])
    try:
        proc.wait_ready()
        yield report
    finally:
        proc.stop()
        with contextlib.suppress(OSError, ValueError):
            report.update(json.loads(Path(out).read_text()))
        os.unlink(out)


def watch(out: Path, interval_ms: float) -> None:
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    block = os.urandom(8192)
    times: list[float] = []
    stalls: list[list[float]] = []
    fd, path = tempfile.mkstemp(prefix="runlane-bench-flush-")
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
        "max_ms": round(max(times), 1) if times else None,
        "stall_ms": STALL_MS,
        "stalls": stalls,
    }
    out.write_text(json.dumps(report))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--interval-ms", type=float, default=10.0)
    args = parser.parse_args()
    watch(args.out, args.interval_ms)


if __name__ == "__main__":
    main()
