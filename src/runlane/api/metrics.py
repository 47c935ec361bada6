"""Prometheus metrics of the API process."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ApiMetrics:
    def __init__(self, subscriber_count: Callable[[], int]) -> None:
        # A registry per app, so that several apps (tests) never collide.
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "runlane_api_requests",
            "HTTP requests answered, by method, route and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "runlane_api_request_seconds",
            "Time to answer an HTTP request (streams: time to the first byte).",
            ["route"],
            registry=self.registry,
        )
        self.lane_refusals = Counter(
            "runlane_lane_refusals",
            "Lane refusals and rejections, by code.",
            ["code"],
            registry=self.registry,
        )
        subscribers = Gauge(
            "runlane_sse_subscribers",
            "Open event-stream subscribers in this process.",
            registry=self.registry,
        )
        subscribers.set_function(lambda: float(subscriber_count()))
