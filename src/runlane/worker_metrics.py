"""Prometheus metrics of a worker process (``runlane worker --metrics-port``)."""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from runlane.background import cancel_and_wait
from runlane.store import RunStore

logger = logging.getLogger(__name__)


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.claims = Counter("runlane_worker_claims", "Runs claimed.", registry=r)
        self.claim_seconds = Histogram(
            "runlane_worker_claim_seconds", "Time of one claim statement.", registry=r
        )
        self.attempts = AttemptCounts()
        r.register(self.attempts)
        self.renewals = Counter(
            "runlane_worker_lease_renewals", "Leases renewed by heartbeats.", registry=r
        )
        self.leases_lost = Counter(
            "runlane_worker_leases_lost",
            "Leases lost (another owner, expiry, or the watchdog gave up).",
            registry=r,
        )
        self.heartbeat_failures = Counter(
            "runlane_worker_heartbeat_failures", "Heartbeat statements that failed.", registry=r
        )
        self.wakeups = Counter(
            "runlane_worker_wakeups",
            (
                "Wake-ups, by what woke the worker: notify, poll, slot (a run"
                " ended) or push (a submit handed it a run)."
            ),
            ["source"],
            registry=r,
        )
        self.running = Gauge(
            "runlane_worker_running",
            "Handlers running here (concurrency slots in use).",
            registry=r,
        )
        self.held = Gauge(
            "runlane_worker_held",
            "Runs whose lease this worker holds: handlers running plus outcomes"
            " being written (at most twice the concurrency).",
            registry=r,
        )
        self._queue = QueueGauges()
        r.register(self._queue)
        self._refresh: asyncio.Task[None] | None = None

    def track(self, running: Callable[[], float], held: Callable[[], float]) -> None:
        """The running and held gauges read the worker's counts when
        scraped, so that starting and ending a run updates no metric (four
        locked updates per run otherwise, on the hot path)."""
        self.running.set_function(running)
        self.held.set_function(held)

    def observe_handler(self, agent: str, seconds: float) -> None:
        self.attempts.observe_handler(agent, seconds)

    def count_finished(self, outcome: str) -> None:
        self.attempts.count_finished(outcome)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """Exposes /metrics on ``port`` (a thread of prometheus_client)."""
        start_http_server(port, addr=host, registry=self.registry)

    async def start_queue_gauges(self, store: RunStore, interval_seconds: float = 5.0) -> None:
        """Refreshes the queue gauges in the background: scrapes never query."""
        self._refresh = asyncio.create_task(self._refresh_loop(store, interval_seconds))

    async def stop(self) -> None:
        await cancel_and_wait(self._refresh)

    async def _refresh_loop(self, store: RunStore, interval: float) -> None:
        while True:
            try:
                self._queue.rows = [dict(row) for row in await store.queue_gauges()]
                self._queue.dead = await store.dead_count()
            except Exception as exc:
                logger.warning("queue gauges not refreshed: %r", exc)
            await asyncio.sleep(interval)


class QueueGauges(Collector):
    """Pending and running runs by agent and tenant, oldest pending age,
    and the dead letter, as last read."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.dead = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        runs = GaugeMetricFamily(
            "runlane_queue_runs",
            "Live runs by status, agent and tenant.",
            labels=["status", "agent", "tenant"],
        )
        oldest = GaugeMetricFamily(
            "runlane_queue_oldest_pending_seconds",
            "Age of the oldest pending run, by agent.",
            labels=["agent"],
        )
        per_agent: dict[str, float] = {}
        for row in self.rows:
            runs.add_metric([row["status"], row["agent"], row["tenant"]], float(row["count"]))
            age = row.get("oldest_pending_seconds")
            if age is not None:
                per_agent[row["agent"]] = max(per_agent.get(row["agent"], 0.0), float(age))
        for agent, age in per_agent.items():
            oldest.add_metric([agent], age)
        dead = GaugeMetricFamily("runlane_queue_dead_runs", "Runs in the dead letter.")
        dead.add_metric([], float(self.dead))
        yield runs
        yield oldest
        yield dead


class AttemptCounts(Collector):
    """Handler run times by agent and ended attempts by outcome, counted in
    plain numbers by the event loop's thread and read when scraped (in the
    metrics server's thread). A prometheus_client metric takes a lock at
    every update, three per run here: about 1.5 us of the worker's CPU per
    no-op run (twenty-third session). A scrape may see a run's count
    before its sum; each series only ever grows."""

    BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 1800.0)

    def __init__(self) -> None:
        # Per agent: the count in each bucket, +Inf last (not cumulative).
        self.handler_counts: dict[str, list[int]] = {}
        self.handler_sums: dict[str, float] = {}
        self.finished: dict[str, int] = {}

    def observe_handler(self, agent: str, seconds: float) -> None:
        counts = self.handler_counts.get(agent)
        if counts is None:
            counts = self.handler_counts[agent] = [0] * (len(self.BUCKETS) + 1)
            self.handler_sums[agent] = 0.0
        # The first bucket whose bound is at least the time (le).
        counts[bisect_left(self.BUCKETS, seconds)] += 1
        self.handler_sums[agent] += seconds

    def count_finished(self, outcome: str) -> None:
        self.finished[outcome] = self.finished.get(outcome, 0) + 1

    def collect(self) -> Iterator[Metric]:
        handler = HistogramMetricFamily(
            "runlane_worker_handler_seconds",
            "Handler run time per attempt, by agent.",
            labels=["agent"],
        )
        # As prometheus_client writes them: 0.01, 1.0, ..., +Inf.
        bounds = [repr(bound) for bound in self.BUCKETS] + ["+Inf"]
        # Copies first: the loop's thread may add an agent meanwhile.
        for agent, counts in list(self.handler_counts.items()):
            cumulative = list(accumulate(list(counts)))
            handler.add_metric(
                [agent],
                list(zip(bounds, cumulative, strict=True)),
                self.handler_sums.get(agent, 0.0),
            )
        finished = CounterMetricFamily(
            "runlane_worker_attempts_finished",
            "Attempts ended, by outcome (completed, failed, retry, cancelled, ...).",
            labels=["outcome"],
        )
        for outcome, count in list(self.finished.items()):
            finished.add_metric([outcome], count)
        yield handler
        yield finished
