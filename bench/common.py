"""Shared plumbing of the benchmarks: databases, worker processes, CPU
readings, statistics, results and plots.

This module imports neither runlane nor a peer at import time, so the peer
adapters (which may run under another interpreter, see
``bench.peers.oban_adapter``) can use it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
PLOTS_DIR = BENCH_DIR / "plots"
AGENT = "bench"

# The server the benchmarks create their databases on (an admin database).
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/test"


def synchronous_commit() -> str:
    """on (PostgreSQL's default: every commit waits for its WAL flush) or off
    (set per benchmark database; shows the CPU-bound costs without the
    disk's flush latency). ``python -m bench ... --synchronous-commit off``."""
    value = os.environ.get("RUNLANE_BENCH_SYNCHRONOUS_COMMIT", "on")
    if value not in ("on", "off"):
        raise ValueError("RUNLANE_BENCH_SYNCHRONOUS_COMMIT must be on or off")
    return value


def result_name(name: str) -> str:
    """The results/plot file name for this figure under the current setting."""
    return name if synchronous_commit() == "on" else f"{name}_sync_off"


def admin_url() -> str:
    return os.environ.get("RUNLANE_BENCH_ADMIN_URL", DEFAULT_ADMIN_URL)


def database_url(name: str) -> str:
    params = pg_conninfo.conninfo_to_dict(admin_url())
    params["dbname"] = name
    return pg_conninfo.make_conninfo(**params)  # type: ignore[arg-type]


def create_database(
    tag: str, *, runlane_schema: bool = True, synchronous_commit: str | None = None
) -> str:
    """A new database on the benchmark server; returns its URL.
    ``synchronous_commit`` (on/off) is set for this database alone."""
    name = f"runlane_bench_{tag}_{uuid.uuid4().hex[:8]}"
    setting = synchronous_commit or globals()["synchronous_commit"]()
    assert setting in ("on", "off")
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = {setting}')
    url = database_url(name)
    if runlane_schema:
        from runlane.migrations import migrate

        migrate(url)
    return url


def drop_database(url: str) -> None:
    close_count_connection(url)
    name = pg_conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def bench_database(
    tag: str, *, runlane_schema: bool = True, synchronous_commit: str | None = None
) -> Iterator[str]:
    url = create_database(tag, runlane_schema=runlane_schema, synchronous_commit=synchronous_commit)
    try:
        yield url
    finally:
        drop_database(url)


# -- counts -----------------------------------------------------------------------

# The harness waits for a queue to drain by counting what is left every 50
# or 100 ms. Each count on a connection of its own started and ended a
# PostgreSQL backend 10-20 times a second, on the cores the system measured
# runs on (BENCHMARKS.md, *Recommended next* 10): one connection per
# database is kept for the counts instead. Its backend is named, so that
# the CPU a figure reads off the database's backends leaves it out.
COUNT_APPLICATION = "runlane-bench-count"
_count_connections: dict[str, psycopg.Connection[Any]] = {}


def count(url: str, query: str, params: Sequence[Any] | None = None) -> int:
    """The integer a counting query answers, on this database's kept
    connection (opened again if it was lost, e.g. by a server restart)."""
    for attempt in (1, 2):
        conn = _count_connections.get(url)
        if conn is None or conn.closed:
            conn = psycopg.connect(url, autocommit=True, application_name=COUNT_APPLICATION)
            _count_connections[url] = conn
        try:
            row = conn.execute(query, params).fetchone()
        except psycopg.OperationalError:
            close_count_connection(url)
            if attempt == 2:
                raise
            continue
        return int(row[0]) if row and row[0] is not None else 0
    raise AssertionError("unreachable")


def close_count_connection(url: str) -> None:
    conn = _count_connections.pop(url, None)
    if conn is not None:
        conn.close()


# -- statistics -----------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear interpolation between ranks."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max in milliseconds."""
    return {
        "n": len(seconds),
        "p50_ms": percentile(seconds, 50) * 1000,
        "p90_ms": percentile(seconds, 90) * 1000,
        "p99_ms": percentile(seconds, 99) * 1000,
        "max_ms": max(seconds) * 1000 if seconds else float("nan"),
    }


def median_of(runs: Sequence[dict[str, Any]], key: str) -> float:
    return median([float(run[key]) for run in runs if run.get(key) is not None])


# -- CPU ------------------------------------------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # Fields after the command: state is [0]; utime [11], stime [12].
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def backend_pids(url: str) -> list[int]:
    """PostgreSQL backends serving the clients connected to this URL's
    database but the harness's counting connection (the server runs on
    this machine, so their CPU can be read from /proc). An autovacuum
    worker on the database is left out: it comes and goes between two
    readings, so its CPU could not be read across them."""
    name = pg_conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        rows = conn.execute(
            """
            SELECT pid FROM pg_stat_activity
            WHERE datname = %s AND backend_type = 'client backend'
              AND pid <> pg_backend_pid() AND application_name IS DISTINCT FROM %s
            """,
            (name, COUNT_APPLICATION),
        ).fetchall()
    return [int(row[0]) for row in rows]


# -- processes -------------------------------------------------------------------


@dataclass
class Proc:
    """A benchmark child process that prints ``ready`` once it serves."""

    popen: subprocess.Popen[str]
    name: str

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_ready(self, timeout: float = 60.0) -> None:
        assert self.popen.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.popen.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.name} exited before it was ready ({self.popen.poll()})")
            if line.strip() == "ready":
                return
        raise RuntimeError(f"{self.name} not ready after {timeout}s")

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)

    def stop(self, timeout: float = 20.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        if self.popen.stdout is not None:
            self.popen.stdout.close()

    def stop_and_read(self, timeout: float = 30.0) -> str:
        """SIGTERM, then everything it printed after ``ready``."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            out, _ = self.popen.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            out, _ = self.popen.communicate()
        return out or ""

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait()
        if self.popen.stdout is not None:
            self.popen.stdout.close()


def imported_src() -> str:
    """The folder of the runlane package this process imports (without
    importing it): a checkout's ``src``, this one's unless another was put
    first on the path (``PYTHONPATH=OTHER/src python -m bench ...``)."""
    spec = importlib.util.find_spec("runlane")
    if spec is None or spec.origin is None:
        return str(ROOT / "src")
    return str(Path(spec.origin).resolve().parents[1])


def spawn(
    module: str,
    args: Sequence[str],
    *,
    python: str | None = None,
    name: str | None = None,
    env_extra: dict[str, str] | None = None,
    src: str | None = None,
) -> Proc:
    """Starts ``python -m module args...`` with the repository on the path
    (``src``: another checkout's ``src`` imported instead of this one's,
    for a before/after comparison in the same rounds). Without ``src`` the
    child imports the runlane this process would: until the forty-first
    session it imported this checkout's ``src`` first whatever the
    PYTHONPATH, so a worker meant to be another checkout's was this one's
    (BENCHMARKS.md, *How to run*)."""
    env = dict(os.environ)
    env.update(env_extra or {})
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), src or imported_src(), env.get("PYTHONPATH", "")) if p
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    popen = subprocess.Popen(
        [python or sys.executable, "-m", module, *args],
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
        env=env,
        cwd=str(ROOT),
    )
    return Proc(popen, name or module)


def run_for_json(module: str, args: Sequence[str], *, src: str, timeout: float = 600) -> Any:
    """Runs ``python -m module args...`` to its end with ``src`` (a
    checkout's ``src``) imported as runlane, and returns the JSON value
    that its last line of output prints (a measurement of one checkout,
    for before/after comparisons in alternate rounds)."""
    out = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        cwd=str(ROOT),
        env={**os.environ, "PYTHONPATH": f"{ROOT}:{src}"},
        check=True,
        timeout=timeout,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def running(procs: list[Proc]) -> Iterator[list[Proc]]:
    try:
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def wait_for(condition: Any, *, timeout: float, interval: float = 0.05, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def spawn_loader_process(
    module: str, url: str, rate: float, tick_ms: float, *, name: str, python: str | None = None
) -> Proc:
    """``python -m module load --url URL --rate R --tick-ms T``: a system's
    loader process (its ``load`` command runs ``add_at_rate``)."""
    args = ["load", "--url", url, "--rate", str(rate), "--tick-ms", str(tick_ms)]
    return spawn(module, args, python=python, name=name)


async def add_at_rate(rate: float, tick_ms: float, add: Callable[[int], Awaitable[None]]) -> None:
    """A loader's loop, until the process is stopped: every ``tick_ms`` it
    calls ``add(batch)`` with what is due by the clock since the start, so a
    loader that falls behind catches up instead of offering less (the
    wake-up figure's loaded phase, for the peers as for runlane)."""
    tick = tick_ms / 1000
    added = 0
    print("ready", flush=True)
    began = next_at = time.monotonic()
    while True:
        batch = int(rate * (time.monotonic() - began)) - added
        if batch > 0:
            await add(batch)
            added += batch
        next_at += tick
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


# -- results ---------------------------------------------------------------------


# The fields of a benchmarked system (a peer adapter module or an object
# like it) that the figures use.
SYSTEM_FIELDS = (
    "NAME",
    "QUEUE_TABLE",
    "available",
    "setup",
    "reset",
    "enqueue",
    "remaining",
    "window",
    "steady_window",
    "spawn_worker",
    "probe",
    # The wake-up figure's loaded phase: jobs done so far, and a loader
    # process adding jobs at a given rate through the system's own enqueue.
    "completed",
    "spawn_loader",
)


def system_variant(system: Any, **changed: Any) -> SimpleNamespace:
    """The same system with some of its fields changed (another name, a
    driver, an enqueue): an adapter's variant, run as a system of its own."""
    fields = {name: getattr(system, name) for name in SYSTEM_FIELDS if hasattr(system, name)}
    return SimpleNamespace(**{**fields, **changed})


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on just now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def machine() -> dict[str, Any]:
    """The machine a result was measured on: its CPUs and memory, the
    Python and PostgreSQL versions, and two speeds that differ between
    machines of the same kind and move a result with them (BENCHMARKS.md,
    *How to read the numbers*): a Python loop's time and an 8 kB write's
    fdatasync, taken as the results are written, after the measurements."""
    info: dict[str, Any] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo") as f:
            total_kb = int(f.readline().split()[1])
        info["memory_gib"] = round(total_kb / 1024 / 1024, 1)
    with contextlib.suppress(Exception), psycopg.connect(admin_url()) as conn:
        row = conn.execute("SHOW server_version").fetchone()
        info["postgresql"] = row[0] if row else None
    info["cpu_model"] = cpu_model()
    info["python_10m_additions_s"] = round(python_loop_seconds(), 3)
    with contextlib.suppress(OSError):
        info["fdatasync_8k_us"] = round(fdatasync_microseconds(), 1)
    return info


def cpu_model() -> str | None:
    """The first CPU's model name, as the kernel reports it."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or None


def python_loop_seconds(n: int = 10_000_000) -> float:
    """A plain Python loop of ``n`` additions: how fast this machine runs
    Python (0.48 to 1.66 s for ten million on this project's machines).
    Run at a module's level, with its names global, as the sessions timed
    it by hand (``python3 -c``): in a function, with local names, the same
    loop takes about half as long."""
    code = compile("total = 0\nfor i in range(n):\n    total += i\n", "<loop>", "exec")
    started = time.perf_counter()
    exec(code, {"n": n})
    return time.perf_counter() - started


def fdatasync_microseconds(writes: int = 100) -> float:
    """The median time of an 8 kB write and its fdatasync to a file in the
    temporary directory: what a commit's flush costs where the database's
    files share that disk, as on the machines of BENCHMARKS.md (pg_test_fsync
    measures the same write)."""
    block = os.urandom(8192)
    times = []
    fd, path = tempfile.mkstemp(prefix="runlane-bench-fdatasync-")
    try:
        for _ in range(writes):
            started = time.perf_counter()
            os.pwrite(fd, block, 0)
            os.fdatasync(fd)
            times.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        os.unlink(path)
    return statistics.median(times) * 1e6


def write_results(name: str, data: dict[str, Any], *, out_dir: Path | None = None) -> Path:
    folder = out_dir or RESULTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{result_name(name)}.json"
    payload = {
        "benchmark": name,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "synchronous_commit": synchronous_commit(),
        "machine": machine(),
        **data,
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def completion_marks(
    url: str, completed_at: str, source: str, low: float, high: float
) -> tuple[float, float]:
    """The times, on the database clock in epoch seconds, at which the
    jobs' completions (the expression ``completed_at`` over ``source``)
    reached the fractions ``low`` and ``high`` of all of them: the
    throughput figure's steady window, without a burn-down's start and
    end."""
    mark = f"extract(epoch FROM percentile_disc(%s) WITHIN GROUP (ORDER BY {completed_at}))"
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(f"SELECT {mark}, {mark} FROM {source}", (low, high)).fetchone()
    assert row is not None and row[0] is not None and row[1] is not None
    return float(row[0]), float(row[1])


def plot(
    name: str,
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    lines: bool = True,
    out_dir: Path | None = None,
) -> Path | None:
    """A line plot to bench/plots/NAME.png (``lines=False``: the points
    alone); None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    folder = out_dir or PLOTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for label, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), marker="o", linestyle="-" if lines else "", label=label)
    if logx:
        ax.set_xscale("symlog", linthresh=10_000)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = folder / f"{result_name(name)}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (printed and returned)."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.2f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text, flush=True)
    return text
