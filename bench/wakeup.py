"""Figure 2: wake-up latency — submit → handler start with an idle
listening worker, submits one at a time (p50/p99); and the same under about
50% load.

A runlane worker process (concurrency 10, mode ``stamp``) serves; this
process submits through ``RunService.submit`` (the real path: one INSERT
with its NOTIFY) a run whose input carries ``time.time()`` taken just
before the call, one every ``--gap`` ms (open loop; each no-op run takes a
few ms, so the worker is idle when the next one arrives). The handler
returns ``time.time()`` at its start; latency = start - submit, both read
from the same machine's clock. Under load, a loader process adds runs at
half the worker's capacity in small batches every 10 ms (``--load-tick-ms``),
each with a wake-up NOTIFY. The capacity is measured first, in the same round, as the
rate the worker completes runs while the same loader offers more than it
can take (the median of a few one-second windows): a burn-down of runs
inserted beforehand (also reported) overstates it, as the worker then
claims full batches and shares the cores with no loader, so half of it
was not a sustainable rate on every machine. The worker's CPU share
during the loaded phase is reported beside it, and the disk's flushes
beneath it (bench.flush_stalls): a flush that stalls holds every commit,
so a round's tail can be the disk's rather than the queue's.

The peers (PGQueuer, oban) are measured the same way, idle and under
half the rate their own worker sustains (each its own loader, through its
own enqueue; ``--idle-peers-only`` leaves that out), each loaded peer
followed by runlane again at that peer's rate (half of runlane's capacity
is not the same load as half of a peer's), and so is
``sql-floor`` (bench.peers.sql_floor): the same probes through bare SQL,
one INSERT with its NOTIFY and one claiming UPDATE, both committed, with
nothing else on the path: the lowest wake-up any PostgreSQL queue can have
on the machine that round, for a queue whose workers pull (claim after a
NOTIFY). ``sql-push-floor`` (bench.peers.sql_push_floor) is the same for a
push design: the submit claims for a parked idle worker in its own commit
and the NOTIFY carries the job, so no claim round trip is on the path.
The pull floor is loaded as the peers are, which gives the lowest loaded
wake-up of a pulling queue on the machine; the push floor is measured idle
only.

``--sweep-rates`` loads runlane again at each rate given, and with
``--sweep-peers`` each loaded peer too, in the same round.
``--other-workers 2x10,1x50`` measures other runlane set-ups (processes by
concurrency) under load, each alone on the emptied tables after the usual
worker (one process of concurrency 10, started afresh each round) has
stopped: the rate it sustains, its probes at half that and at each swept
rate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from bench import flush_stalls, runlane_system
from bench.common import (
    AGENT,
    Proc,
    bench_database,
    count,
    latency_summary,
    median,
    plot,
    print_table,
    running,
    spawn,
    system_variant,
    wait_for,
    write_results,
)
from bench.procs import read_lease_counts

T = TypeVar("T")

# The bare-SQL floors (bench.peers.sql_floor, sql_push_floor) are measured in
# every round by default: how far any queue on this machine is from the
# target, pulling or pushing.
DEFAULT_PEERS = ["pgqueuer", "pgqueuer-asyncpg", "oban", "sql-floor", "sql-push-floor"]

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"n": 20, "gap_ms": 10, "capacity_n": 100, "listen_wait": 0.5, "window_s": 0.3},
    "small": {"n": 300, "gap_ms": 20, "capacity_n": 3000, "listen_wait": 2.0, "window_s": 1.0},
    "full": {"n": 1000, "gap_ms": 20, "capacity_n": 5000, "listen_wait": 2.0, "window_s": 1.0},
}


async def submit_probes(url: str, n: int, gap: float, via: str = "runs") -> list[float]:
    """Submits n probe runs one at a time; returns each submit call's time.
    ``via``: ``runs`` submits runs (``RunService.submit``); ``lanes``
    submits requests (``LaneService.submit``, the call behind ``POST
    /v1/threads/{t}/requests``), each to a new thread, so each lane is idle
    and its request is dispatched at intake."""
    from runlane.database import create_pool
    from runlane.lane_service import LaneService
    from runlane.lane_store import LaneStore
    from runlane.service import RunService
    from runlane.settings import Settings
    from runlane.store import RunStore

    # The API's pool check (no round trip at checkout), as the peers' probes
    # (PGQueuer's connection, oban's pool) send none; until the ninth
    # session every probe paid a check round trip first.
    pool = create_pool(url, min_size=1, max_size=2, check="quiet")
    await pool.open()
    service = RunService(RunStore(pool), Settings(database_url=url))
    lanes = LaneService(LaneStore(pool), service)
    thread_prefix = f"probe-{time.time_ns()}"
    submit_seconds = []
    try:
        next_at = time.monotonic()
        for i in range(n):
            started = time.monotonic()
            probe = {"t": time.time(), "probe": True}
            if via == "lanes":
                await lanes.submit(
                    tenant="default",
                    user_id="default",
                    agent=AGENT,
                    thread_id=f"{thread_prefix}-{i}",
                    input=probe,
                )
            else:
                await service.submit(AGENT, probe)
            submit_seconds.append(time.monotonic() - started)
            next_at += gap
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        await pool.close()
    return submit_seconds


def probe_latencies(url: str) -> list[float]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            """
            SELECT (output ->> 'started')::float8 - (input ->> 't')::float8
            FROM runlane.runs WHERE input ? 'probe' AND status = 'completed'
            """
        ).fetchall()
    return [float(r[0]) for r in rows]


def pending_probes(url: str) -> int:
    return count(
        url, "SELECT count(*) FROM runlane.runs WHERE input ? 'probe' AND status <> 'completed'"
    )


def capacity(url: str, n: int) -> float:
    """Runs/s of the running worker on an n-run burn-down."""
    runlane_system.reset(url)
    runlane_system.enqueue(url, n)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_notify('runlane_wakeup', %s)", (AGENT,))
    wait_for(lambda: runlane_system.remaining(url) == 0, timeout=60 + n / 50, what="burn-down")
    first, last = runlane_system.window(url)
    return n / (last - first)


def sustained_capacity(
    url: str, offered: float, window: float, windows: int = 3, *, system: Any = None
) -> float:
    """Runs/s the running worker completes while a loader offers
    ``offered`` runs/s (more than it can take): the median of ``windows``
    windows after one of warm-up. ``system``: a peer's (its loader, its
    count of jobs done), else runlane's."""
    if system is None:
        system = system_variant(runlane_system, spawn_loader=spawn_loader)
    system.reset(url)
    loader = system.spawn_loader(url, offered)
    rates = []
    with running([loader]):
        loader.wait_ready()
        time.sleep(window)  # warm-up: the backlog forms
        before, at = system.completed(url), time.monotonic()
        for _ in range(windows):
            time.sleep(window)
            after, now = system.completed(url), time.monotonic()
            rates.append((after - before) / (now - at))
            before, at = after, now
    wait_for(lambda: system.remaining(url) == 0, timeout=120, what="saturating load")
    return median(rates)


def peer_capacity(system: Any, url: str, first_offer: float, window: float) -> float:
    """A peer's worker's sustained rate, measured as runlane's: a loader
    offering more than it takes. A first, short offer (runlane's capacity
    that round) gives its rate roughly, doubled while the worker kept up
    with it; then 1.5 times that rough rate, as runlane is offered."""
    offer = first_offer
    rough = sustained_capacity(url, offer, window, windows=1, system=system)
    for _ in range(3):
        if rough < 0.9 * offer:
            break
        offer *= 2
        rough = sustained_capacity(url, offer, window, windows=1, system=system)
    return sustained_capacity(url, 1.5 * rough, window, system=system)


def wakeup_systems(names: list[str]) -> tuple[list[Any], dict[str, str]]:
    """The peers to measure beside runlane (and those skipped, with the
    reason): the throughput figure's peers, and the bare-SQL floor, which
    only this figure has."""
    from bench.peers import sql_floor, sql_push_floor
    from bench.throughput import systems

    floors = [floor for floor in (sql_floor, sql_push_floor) if floor.NAME in names]
    chosen, skipped = systems([name for name in names if name not in {f.NAME for f in floors}])
    return chosen + floors, skipped


@contextlib.contextmanager
def stamping_peer(
    system: Any, url: str, listen_wait: float
) -> Iterator[tuple[Proc, dict[str, Any]]]:
    """A peer's stamping worker (concurrency 10) on emptied tables, listening;
    at exit it is stopped, and the dict yielded holds what it reported: the
    probes' start - submit in ``latencies``, and anything else it counted
    (sql-push-floor: its pushed jobs)."""
    system.setup(url)
    system.reset(url)
    worker = system.spawn_worker(url, 10, mode="stamp")
    reported: dict[str, Any] = {}
    try:
        worker.wait_ready()
        time.sleep(listen_wait)  # let it LISTEN before the first job
        yield worker, reported
    finally:
        out = worker.stop_and_read()
        lines = [line for line in out.splitlines() if line.startswith("{")]
        reported.update(json.loads(lines[-1]) if lines else {})


def peer_phase(
    system: Any, url: str, n: int, gap: float, *, listen_wait: float = 2.0
) -> dict[str, Any]:
    """The same idle wake-up figure for a peer queue: its worker (concurrency
    10) records start - submit in the handler and prints them at exit."""
    with stamping_peer(system, url, listen_wait) as (_, reported):
        system.probe(url, n, gap)
        wait_for(lambda: system.remaining(url) == 0, timeout=60, what=f"{system.NAME} probes")
    latencies = reported.pop("latencies", [])
    return {"latency": latency_summary(latencies), **reported}


def peer_loaded_phase(
    system: Any,
    url: str,
    n: int,
    gap: float,
    *,
    first_offer: float,
    window: float,
    listen_wait: float = 2.0,
    load_tick_ms: float = 10.0,
    rate: float | None = None,
) -> dict[str, Any]:
    """The loaded wake-up figure for a peer queue, as runlane's: its worker
    (concurrency 10) under its own loader at half the rate it sustains
    (or at ``rate``, its capacity then not measured), the probes one at a
    time beside the load, the disk's flushes watched."""
    with stamping_peer(system, url, listen_wait) as (worker, reported):
        cap = peer_capacity(system, url, first_offer, window) if rate is None else None
        system.reset(url)
        if rate is None:
            assert cap is not None
            rate = cap / 2
        loader = system.spawn_loader(url, rate, tick_ms=load_tick_ms)
        _, beside = probed_under_load(
            loader,
            [worker],
            lambda: system.probe(url, n, gap),
            lambda: system.remaining(url),
            timeout=120,
            what=f"{system.NAME} load",
        )
    latencies = reported.pop("latencies", [])
    return {
        "latency": latency_summary(latencies),
        "capacity": cap,
        "rate": rate,
        **beside,
        **reported,
    }


def probed_under_load(
    loader: Proc,
    workers: Sequence[Proc],
    probe: Callable[[], T],
    remaining: Callable[[], int],
    *,
    timeout: float,
    what: str,
) -> tuple[T, dict[str, Any]]:
    """``probe()`` while ``loader`` runs, after a second to reach a steady
    state: what it returns, and beside it the workers' CPU share
    meanwhile (summed over their processes), the backlog left at the end
    and the disk's flushes beneath it (a stall holds every commit, and the
    tail with it). The loader is stopped and the workers finish the load
    before it returns."""
    with running([loader]):
        loader.wait_ready()
        time.sleep(1.0)  # reach a steady state
        with flush_stalls.watching() as flushes:
            cpu_before, at = cpu_seconds(workers), time.monotonic()
            measured = probe()
            worker_busy = (cpu_seconds(workers) - cpu_before) / (time.monotonic() - at)
        backlog = remaining()
    # Let the worker finish the load before the tables are reset.
    wait_for(lambda: remaining() == 0, timeout=timeout, what=what)
    return measured, {
        "worker_cpu_share": worker_busy,
        "backlog_at_end": backlog,
        "loaded_flushes": flushes,
    }


def cpu_seconds(procs: Sequence[Proc]) -> float:
    return sum(proc.cpu_seconds() for proc in procs)


def loaded_phase(
    url: str,
    workers: Sequence[Proc],
    rate: float,
    n: int,
    gap: float,
    via: str,
    load_tick_ms: float,
) -> dict[str, Any]:
    """runlane's probes beside its loader adding ``rate`` runs/s (see
    probed_under_load)."""
    measured, beside = probed_under_load(
        spawn_loader(url, rate, tick_ms=load_tick_ms),
        workers,
        lambda: phase(url, n, gap, via),
        lambda: runlane_system.remaining(url),
        timeout=60,
        what="load",
    )
    return {**measured, "rate": rate, **beside}


@dataclass(frozen=True)
class WorkerSetup:
    """runlane's workers for a figure: ``procs`` processes of concurrency
    ``concurrency`` each, named as ``--other-workers`` spells it."""

    procs: int
    concurrency: int

    @property
    def name(self) -> str:
        return f"{self.procs}x{self.concurrency}"

    @classmethod
    def parse(cls, text: str) -> WorkerSetup:
        procs, sep, concurrency = text.strip().partition("x")
        if not sep or not procs.isdigit() or not concurrency.isdigit():
            raise ValueError(f"worker set-up {text!r}: expected PROCSxCONCURRENCY, e.g. 2x10")
        setup = cls(int(procs), int(concurrency))
        if setup.procs < 1 or setup.concurrency < 1:
            raise ValueError(f"worker set-up {text!r}: processes and concurrency must be >= 1")
        return setup


def worker_setups(text: str) -> list[WorkerSetup]:
    """``--other-workers``' value: comma-separated set-ups, e.g. ``2x10,1x50``."""
    try:
        return [WorkerSetup.parse(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


# The set-up every figure of this benchmark has used since the first
# session, and the peers' (concurrency 10).
MAIN_WORKERS = WorkerSetup(1, 10)


@contextlib.contextmanager
def runlane_workers(
    url: str, setup: WorkerSetup, *, src: str | None, listen_wait: float
) -> Iterator[tuple[list[Proc], dict[str, float]]]:
    """runlane's stamping workers of ``setup``, serving and listening; at
    exit they are stopped, and the dict yielded holds their lease counts
    summed (bench.procs.lease_counts)."""
    workers = [
        runlane_system.spawn_worker(url, setup.concurrency, mode="stamp", src=src)
        for _ in range(setup.procs)
    ]
    counts: dict[str, float] = {}
    try:
        for worker in workers:
            worker.wait_ready()
        time.sleep(listen_wait)  # let them LISTEN before the first run
        yield workers, counts
    finally:
        # Every worker stopped before any output is read: a count that
        # cannot be read leaves no process behind.
        outputs = [worker.stop_and_read() for worker in workers]
        for out in outputs:
            for name, value in read_lease_counts(out).items():
                counts[name] = counts.get(name, 0.0) + value


def loaded_phases(
    url: str,
    workers: Sequence[Proc],
    cfg: dict[str, Any],
    *,
    via: str,
    load_tick_ms: float,
    sweep_rates: Sequence[float],
    rate: float | None = None,
) -> dict[str, Any]:
    """A worker set-up under load: the rate its workers sustain (a
    burn-down's rate offered 1.5 times over, see sustained_capacity), its
    probes at half that (or at ``rate``: the same load for set-ups of
    different capacities), and at each swept rate."""
    gap = cfg["gap_ms"] / 1000
    burn_down = capacity(url, cfg["capacity_n"])
    cap = sustained_capacity(url, 1.5 * burn_down, cfg["window_s"])
    runlane_system.reset(url)
    loaded = loaded_phase(url, workers, rate or cap / 2, cfg["n"], gap, via, load_tick_ms)
    sweep = []
    for swept in sweep_rates:
        runlane_system.reset(url)
        sweep.append(loaded_phase(url, workers, swept, cfg["n"], gap, via, load_tick_ms))
    return {"capacity": cap, "burn_down_capacity": burn_down, "loaded": loaded, "sweep": sweep}


def phase(url: str, n: int, gap: float, via: str = "runs") -> dict[str, Any]:
    submit_seconds = asyncio.run(submit_probes(url, n, gap, via))
    wait_for(lambda: pending_probes(url) == 0, timeout=60, what="probes")
    latencies = probe_latencies(url)
    return {"latency": latency_summary(latencies), "submit": latency_summary(submit_seconds)}


def run(
    size: str = "small",
    runs: int = 3,
    *,
    peers: list[str] | None = None,
    out_dir: Path | None = None,
    via: str = "runs",
    load_rate: float | None = None,
    worker_src: str | None = None,
    load_tick_ms: float = 10.0,
    peers_loaded: bool = True,
    sweep_rates: Sequence[float] = (),
    other_workers: Sequence[WorkerSetup] = (),
    sweep_peers: bool = False,
) -> dict[str, Any]:
    cfg = SIZES[size]
    gap = cfg["gap_ms"] / 1000
    rounds: list[dict[str, Any]] = []
    peer_systems, skipped = wakeup_systems(peers if peers is not None else DEFAULT_PEERS)
    with bench_database("wakeup") as url:
        # Every worker set-up is loaded alike; only the usual one's
        # half-capacity load may be fixed (--load-rate).
        under_load = functools.partial(
            loaded_phases,
            url,
            cfg=cfg,
            via=via,
            load_tick_ms=load_tick_ms,
            sweep_rates=sweep_rates,
        )
        for rnd in range(runs):
            with runlane_workers(
                url, MAIN_WORKERS, src=worker_src, listen_wait=cfg["listen_wait"]
            ) as (workers, lease_counts):
                runlane_system.reset(url)
                idle = phase(url, cfg["n"], gap, via)
                peer_idle = {}
                for system in peer_systems:
                    peer_idle[system.NAME] = peer_phase(
                        system, url, cfg["n"], gap, listen_wait=cfg["listen_wait"]
                    )
                    print(
                        f"round {rnd}: {system.NAME} idle p50"
                        f" {peer_idle[system.NAME]['latency']['p50_ms']:.2f} ms p99"
                        f" {peer_idle[system.NAME]['latency']['p99_ms']:.2f} ms",
                        flush=True,
                    )
                own = under_load(workers, rate=load_rate)
                cap, burn_down = own["capacity"], own["burn_down_capacity"]
                loaded, sweep = own["loaded"], own["sweep"]
                rate = loaded["rate"]
                flushes = loaded.pop("loaded_flushes")
                worker_busy = loaded.pop("worker_cpu_share")
                backlog = loaded.pop("backlog_at_end")
                peer_loaded: dict[str, Any] = {}
                at_peer_rate: dict[str, Any] = {}
                rounds.append(
                    {
                        "round": rnd,
                        "idle": idle,
                        "peers_idle": peer_idle,
                        "peers_loaded": peer_loaded,
                        "runlane_at_peer_rate": at_peer_rate,
                        "runlane_sweep": sweep,
                        "peers_sweep": {},
                        "other_workers": {},
                        "loaded": loaded,
                        "capacity": cap,
                        "burn_down_capacity": burn_down,
                        "rate": rate,
                        "worker_cpu_share": worker_busy,
                        "backlog_at_end": backlog,
                        "loaded_flushes": flushes,
                    }
                )
                print(
                    f"round {rnd}: idle p50 {idle['latency']['p50_ms']:.2f} ms"
                    f" p99 {idle['latency']['p99_ms']:.2f} ms; capacity {cap:.0f}/s"
                    f" (burn-down {burn_down:.0f}/s); at {rate:.0f}/s p50"
                    f" {loaded['latency']['p50_ms']:.2f} ms p99"
                    f" {loaded['latency']['p99_ms']:.2f} ms (backlog {backlog},"
                    f" worker CPU {100 * worker_busy:.0f}%; longest 8 kB flush"
                    f" {flushes.get('max_ms')} ms)",
                    flush=True,
                )
                # runlane at each rate asked for: its p99 against the load.
                for swept, at in zip(sweep_rates, sweep, strict=True):
                    print(
                        f"round {rnd}: runlane at {swept:.0f}/s p50"
                        f" {at['latency']['p50_ms']:.2f} ms p99 {at['latency']['p99_ms']:.2f} ms"
                        f" (worker CPU {100 * at['worker_cpu_share']:.0f}%; longest 8 kB flush"
                        f" {at['loaded_flushes'].get('max_ms')} ms)",
                        flush=True,
                    )
                # The peers at half their own capacity, after runlane's load.
                peer_load: dict[str, float] = {
                    "first_offer": cap,
                    "window": cfg["window_s"],
                    "listen_wait": cfg["listen_wait"],
                    "load_tick_ms": load_tick_ms,
                }
                for system in peer_systems:
                    if not peers_loaded or not hasattr(system, "spawn_loader"):
                        continue
                    peer_loaded[system.NAME] = measured = peer_loaded_phase(
                        system, url, cfg["n"], gap, **peer_load
                    )
                    print(
                        f"round {rnd}: {system.NAME} at {measured['rate']:.0f}/s"
                        f" (capacity {measured['capacity']:.0f}/s) p50"
                        f" {measured['latency']['p50_ms']:.2f} ms p99"
                        f" {measured['latency']['p99_ms']:.2f} ms (backlog"
                        f" {measured['backlog_at_end']}, worker CPU"
                        f" {100 * measured['worker_cpu_share']:.0f}%; longest 8 kB flush"
                        f" {measured['loaded_flushes'].get('max_ms')} ms)",
                        flush=True,
                    )
                    # runlane at the same rate, in the same round: the
                    # comparison at one load, where "half the capacity" is
                    # a different rate for each system.
                    runlane_system.reset(url)
                    at_peer_rate[system.NAME] = same = loaded_phase(
                        url, workers, measured["rate"], cfg["n"], gap, via, load_tick_ms
                    )
                    print(
                        f"round {rnd}: runlane at {system.NAME}'s {measured['rate']:.0f}/s p50"
                        f" {same['latency']['p50_ms']:.2f} ms p99"
                        f" {same['latency']['p99_ms']:.2f} ms (worker CPU"
                        f" {100 * same['worker_cpu_share']:.0f}%; longest 8 kB flush"
                        f" {same['loaded_flushes'].get('max_ms')} ms)",
                        flush=True,
                    )
                    # The peer at each swept rate too: the same loads as
                    # runlane's sweep, in the same round.
                    if not sweep_peers:
                        continue
                    rounds[-1]["peers_sweep"][system.NAME] = peer_sweep = []
                    for swept in sweep_rates:
                        peer_sweep.append(
                            at := peer_loaded_phase(
                                system, url, cfg["n"], gap, **peer_load, rate=swept
                            )
                        )
                        print(
                            f"round {rnd}: {system.NAME} at {swept:.0f}/s p50"
                            f" {at['latency']['p50_ms']:.2f} ms p99"
                            f" {at['latency']['p99_ms']:.2f} ms (backlog {at['backlog_at_end']},"
                            f" worker CPU {100 * at['worker_cpu_share']:.0f}%)",
                            flush=True,
                        )
            rounds[-1]["lease_counts"] = lease_counts
            print(f"round {rnd}: runlane's worker's leases: {lease_counts}", flush=True)
            # The other worker set-ups, each alone on the emptied tables.
            for setup in other_workers:
                with runlane_workers(
                    url, setup, src=worker_src, listen_wait=cfg["listen_wait"]
                ) as (workers, other_counts):
                    rounds[-1]["other_workers"][setup.name] = measured = under_load(workers)
                measured["lease_counts"] = other_counts
                print(
                    f"round {rnd}: runlane {setup.name}: capacity {measured['capacity']:.0f}/s;"
                    + "; ".join(
                        f" at {phase['rate']:.0f}/s p99 {phase['latency']['p99_ms']:.2f} ms"
                        for phase in [measured["loaded"], *measured["sweep"]]
                    ),
                    flush=True,
                )
    summary: dict[str, Any] = {
        f"{ph}_{key}": median([r[ph][part][f"{key}_ms"] for r in rounds])
        for ph in ("idle", "loaded")
        for part, key in (("latency", "p50"), ("latency", "p99"))
    }
    summary["submit_p50_ms"] = median([r["idle"]["submit"]["p50_ms"] for r in rounds])
    summary["submit_p99_ms"] = median([r["idle"]["submit"]["p99_ms"] for r in rounds])
    summary["capacity_per_s"] = median([r["capacity"] for r in rounds])
    summary["burn_down_capacity_per_s"] = median([r["burn_down_capacity"] for r in rounds])
    summary["load_per_s"] = median([r["rate"] for r in rounds])
    summary["loaded_worker_cpu_share"] = median([r["worker_cpu_share"] for r in rounds])
    # The longest 8 kB flush beneath each round's loaded phase, in order.
    summary["loaded_longest_flush_ms"] = [r["loaded_flushes"].get("max_ms") for r in rounds]
    # Leases runlane's workers lost, every round and set-up together (the
    # forty-ninth session saw 39 in one round, without a count kept).
    summary["leases_lost"] = sum(
        counts.get("leases_lost", 0.0)
        for r in rounds
        for counts in [
            r["lease_counts"],
            *(m["lease_counts"] for m in r["other_workers"].values()),
        ]
    )
    table_rows: list[list[Any]] = [
        ["runlane, idle worker", summary["idle_p50"], summary["idle_p99"], ""],
        [
            f"runlane, {'a fixed' if load_rate else '~50%'} load"
            f" ({summary['load_per_s']:.0f} runs/s,"
            f" worker CPU {100 * summary['loaded_worker_cpu_share']:.0f}%)",
            summary["loaded_p50"],
            summary["loaded_p99"],
            "",
        ],
    ]
    for system in peer_systems:
        name = system.NAME
        p50 = median([r["peers_idle"][name]["latency"]["p50_ms"] for r in rounds])
        p99 = median([r["peers_idle"][name]["latency"]["p99_ms"] for r in rounds])
        ratio = median(
            [
                r["idle"]["latency"]["p50_ms"] / r["peers_idle"][name]["latency"]["p50_ms"]
                for r in rounds
            ]
        )
        summary[f"{name}_idle_p50"] = p50
        summary[f"{name}_idle_p99"] = p99
        summary[f"runlane_over_{name}_p50"] = ratio
        table_rows.append([f"{name}, idle worker", p50, p99, ratio])
    for name in rounds[0]["peers_loaded"]:
        loaded_runs = [r["peers_loaded"][name] for r in rounds]
        p50, p99 = latency_medians(loaded_runs)
        summary[f"{name}_loaded_p50"] = p50
        summary[f"{name}_loaded_p99"] = p99
        summary[f"{name}_load_per_s"] = median([m["rate"] for m in loaded_runs])
        summary[f"{name}_loaded_worker_cpu_share"] = median(
            [m["worker_cpu_share"] for m in loaded_runs]
        )
        summary[f"{name}_loaded_longest_flush_ms"] = [
            m["loaded_flushes"].get("max_ms") for m in loaded_runs
        ]
        ratio = median(
            [
                r["loaded"]["latency"]["p99_ms"] / r["peers_loaded"][name]["latency"]["p99_ms"]
                for r in rounds
            ]
        )
        summary[f"runlane_over_{name}_loaded_p99"] = ratio
        same_rate = [r["runlane_at_peer_rate"][name] for r in rounds]
        same_p50, same_p99 = latency_medians(same_rate)
        summary[f"runlane_at_{name}_rate_p50"] = same_p50
        summary[f"runlane_at_{name}_rate_p99"] = same_p99
        same_ratio = median(
            [
                r["runlane_at_peer_rate"][name]["latency"]["p99_ms"]
                / r["peers_loaded"][name]["latency"]["p99_ms"]
                for r in rounds
            ]
        )
        summary[f"runlane_at_{name}_rate_over_{name}_p99"] = same_ratio
        table_rows.append(
            [
                f"{name}, ~50% load ({summary[f'{name}_load_per_s']:.0f} jobs/s,"
                f" worker CPU {100 * summary[f'{name}_loaded_worker_cpu_share']:.0f}%)",
                p50,
                p99,
                ratio,
            ]
        )
        table_rows.append(
            [f"runlane at {name}'s load, the same rounds", same_p50, same_p99, same_ratio]
        )
    for i, swept in enumerate(sweep_rates):
        at_rate = [r["runlane_sweep"][i] for r in rounds]
        p50, p99 = latency_medians(at_rate)
        summary.setdefault("sweep", []).append({"rate": swept, "p50_ms": p50, "p99_ms": p99})
        table_rows.append([f"runlane at {swept:.0f} runs/s", p50, p99, ""])
    for name in rounds[0]["peers_sweep"]:
        summary[f"{name}_sweep"] = peer_rows = []
        for i, swept in enumerate(sweep_rates):
            peer_at: list[dict[str, Any]] = [r["peers_sweep"][name][i] for r in rounds]
            p50, p99 = latency_medians(peer_at)
            ratio = median(
                [
                    r["runlane_sweep"][i]["latency"]["p99_ms"]
                    / r["peers_sweep"][name][i]["latency"]["p99_ms"]
                    for r in rounds
                ]
            )
            peer_rows.append(
                {"rate": swept, "p50_ms": p50, "p99_ms": p99, "runlane_over_it_p99": ratio}
            )
            table_rows.append([f"{name} at {swept:.0f} jobs/s", p50, p99, ratio])
    for setup in other_workers:
        by_round: list[dict[str, Any]] = [r["other_workers"][setup.name] for r in rounds]
        own_half: list[dict[str, Any]] = [m["loaded"] for m in by_round]
        own_p50, own_p99 = latency_medians(own_half)
        other: dict[str, Any] = {
            "capacity_per_s": median([m["capacity"] for m in by_round]),
            "load_per_s": median([m["rate"] for m in own_half]),
            "loaded_p50": own_p50,
            "loaded_p99": own_p99,
            "loaded_worker_cpu_share": median([m["worker_cpu_share"] for m in own_half]),
            "sweep": [],
        }
        summary.setdefault("other_workers", {})[setup.name] = other
        table_rows.append(
            [
                f"runlane {setup.name}, ~50% load ({other['load_per_s']:.0f} runs/s,"
                f" workers' CPU {100 * other['loaded_worker_cpu_share']:.0f}%)",
                other["loaded_p50"],
                other["loaded_p99"],
                "",
            ]
        )
        for i, swept in enumerate(sweep_rates):
            swept_by_round: list[dict[str, Any]] = [m["sweep"][i] for m in by_round]
            p50, p99 = latency_medians(swept_by_round)
            other["sweep"].append({"rate": swept, "p50_ms": p50, "p99_ms": p99})
            table_rows.append([f"runlane {setup.name} at {swept:.0f} runs/s", p50, p99, ""])
    summary["table"] = print_table(
        ["submit -> handler start", "p50 ms", "p99 ms", "runlane / this (p50 idle, p99 loaded)"],
        table_rows,
    )
    data = {
        "size": size,
        "runs": runs,
        "via": via,
        "load_rate": load_rate,
        "worker_src": worker_src,
        "load_tick_ms": load_tick_ms,
        "peers_loaded": peers_loaded,
        "sweep_rates": list(sweep_rates),
        "sweep_peers": sweep_peers,
        "workers": MAIN_WORKERS.name,
        "other_workers": [setup.name for setup in other_workers],
        "config": cfg,
        "skipped": skipped,
        "rounds": rounds,
        "summary": summary,
    }
    write_results("wakeup" if via == "runs" else "wakeup_lanes", data, out_dir=out_dir)
    if rounds[0]["peers_loaded"] or sweep_rates or other_workers:
        plot_loaded(data, out_dir=out_dir)
    return data


def latency_medians(phases: Sequence[dict[str, Any]]) -> tuple[float, float]:
    """The median over rounds of the phases' p50 and of their p99, ms."""
    return (
        median([phase["latency"]["p50_ms"] for phase in phases]),
        median([phase["latency"]["p99_ms"] for phase in phases]),
    )


def loaded_points(data: dict[str, Any]) -> dict[str, tuple[Sequence[float], Sequence[float]]]:
    """Every loaded phase of a wake-up result as (rate, p99) points by
    system, each system's sorted by rate: runlane's at its own half
    capacity, at each peer's rate and at each rate swept, each peer's at
    its own half (and at each rate swept, with ``--sweep-peers``), and
    each other worker set-up's at its own half and at each rate swept
    (as "runlane 2x10")."""
    points: dict[str, list[tuple[float, float]]] = {"runlane": []}
    for r in data["rounds"]:
        points["runlane"].append((r["rate"], r["loaded"]["latency"]["p99_ms"]))
        for name, measured in r["peers_loaded"].items():
            points.setdefault(name, []).append((measured["rate"], measured["latency"]["p99_ms"]))
            same = r["runlane_at_peer_rate"][name]
            points["runlane"].append((same["rate"], same["latency"]["p99_ms"]))
        for swept in r.get("runlane_sweep", []):
            points["runlane"].append((swept["rate"], swept["latency"]["p99_ms"]))
        for name, phases in r.get("peers_sweep", {}).items():
            points[name].extend((phase["rate"], phase["latency"]["p99_ms"]) for phase in phases)
        for name, measured in r.get("other_workers", {}).items():
            points.setdefault(f"runlane {name}", []).extend(
                (phase["rate"], phase["latency"]["p99_ms"])
                for phase in [measured["loaded"], *measured["sweep"]]
            )
    return {
        name: ([rate for rate, _ in sorted(pairs)], [p99 for _, p99 in sorted(pairs)])
        for name, pairs in points.items()
    }


def plot_loaded(data: dict[str, Any], *, out_dir: Path | None = None) -> Path | None:
    """The loaded wake-up's p99 against the load, every phase of every
    round (``wakeup_loaded.png``): where each system's half capacity lies,
    and runlane at the same loads."""
    return plot(
        "wakeup_loaded",
        loaded_points(data),
        title="Wake-up p99 under load (each phase of each round)",
        xlabel="load, jobs/s",
        ylabel="submit -> handler start p99, ms",
        lines=False,
        out_dir=out_dir,
    )


# -- the loader process -------------------------------------------------------------


def spawn_loader(url: str, rate: float, *, tick_ms: float = 10.0) -> Proc:
    """The loader process (``load`` below); it says ready once connected."""
    args = ["load", "--url", url, "--rate", str(rate), "--tick-ms", str(tick_ms)]
    return spawn("bench.wakeup", args, name="loader")


def load(url: str, rate: float, tick_ms: float = 10.0) -> None:
    """Adds ``rate`` runs/s in a batch every ``tick_ms`` until killed: each
    batch is what is due by the clock since the start, so a loader that
    falls behind catches up instead of offering less."""
    tick = tick_ms / 1000
    start = 0
    with psycopg.connect(url, autocommit=True) as conn:
        print("ready", flush=True)
        began = next_at = time.monotonic()
        while True:
            batch = int(rate * (time.monotonic() - began)) - start
            if batch > 0:
                with conn.transaction():
                    runlane_system.insert_pending(conn, batch, start=start)
                    conn.execute("SELECT pg_notify('runlane_wakeup', %s)", (AGENT,))
                start += batch
            next_at += tick
            time.sleep(max(0.0, next_at - time.monotonic()))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--via",
        choices=["runs", "lanes"],
        default="runs",
        help="probes submitted as runs, or as requests to idle lanes (a new thread each)",
    )
    parser.add_argument(
        "--peers",
        default=",".join(DEFAULT_PEERS),
        help=(
            "peers measured idle too, and the bare-SQL floors sql-floor (pull)"
            " and sql-push-floor (push) ('' for none)"
        ),
    )
    parser.add_argument(
        "--load-rate",
        type=float,
        default=None,
        help="runs/s offered in the loaded phase (default: half the capacity measured)",
    )
    parser.add_argument(
        "--load-tick-ms",
        type=float,
        default=10.0,
        help=(
            "the loaded phase's loader adds what is due every this many ms, with"
            " one NOTIFY (default 10; the capacity is measured with 10 either way)"
        ),
    )
    parser.add_argument(
        "--sweep-rates",
        default="",
        help=(
            "runlane's loaded phase again at each of these runs/s (comma-separated),"
            " in every round: its p99 against the load"
        ),
    )
    parser.add_argument(
        "--sweep-peers",
        action="store_true",
        help=(
            "the loaded peers (the pull floor among them) at each --sweep-rates rate"
            " too, in the same rounds as runlane's"
        ),
    )
    parser.add_argument(
        "--other-workers",
        type=worker_setups,
        default=[],
        help=(
            "other runlane worker set-ups, PROCSxCONCURRENCY (comma-separated, e.g."
            " 2x10,1x50), each measured alone in every round: the rate it sustains,"
            " its probes at half that and at each --sweep-rates rate"
        ),
    )
    parser.add_argument(
        "--idle-peers-only",
        action="store_true",
        help=(
            "measure the peers idle only (by default those with a loader, the"
            " queues and the pull floor, are measured at half their capacity too)"
        ),
    )
    parser.add_argument(
        "--worker-src",
        default=None,
        help="another checkout's src/ for the runlane worker (a before/after at one load)",
    )


def main(args: argparse.Namespace) -> dict[str, Any]:
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    return run(
        args.size,
        args.runs,
        peers=peers,
        out_dir=args.out_dir,
        via=args.via,
        load_rate=args.load_rate,
        worker_src=args.worker_src,
        load_tick_ms=args.load_tick_ms,
        peers_loaded=not args.idle_peers_only,
        sweep_rates=[float(rate) for rate in args.sweep_rates.split(",") if rate.strip()],
        other_workers=args.other_workers,
        sweep_peers=args.sweep_peers,
    )


if __name__ == "__main__":
    loader = argparse.ArgumentParser()
    loader.add_argument("command", choices=["load"])
    loader.add_argument("--url", required=True)
    loader.add_argument("--rate", type=float, required=True)
    loader.add_argument("--tick-ms", type=float, default=10.0)
    parsed = loader.parse_args()
    try:
        load(parsed.url, parsed.rate, parsed.tick_ms)
    except KeyboardInterrupt:
        sys.exit(0)
