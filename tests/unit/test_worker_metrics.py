"""The worker's per-run counts (runlane.worker_metrics.AttemptCounts), as
Prometheus reads them: the series prometheus_client's own Histogram and
Counter wrote before, counted without a lock per run."""

from __future__ import annotations

from prometheus_client import generate_latest

from runlane.worker_metrics import WorkerMetrics


def exposition(metrics: WorkerMetrics) -> list[str]:
    return generate_latest(metrics.registry).decode().splitlines()


def test_handler_times_fall_in_the_first_bucket_at_least_as_large() -> None:
    metrics = WorkerMetrics()
    for seconds in (0.004, 0.01, 0.02, 7.0, 4000.0):
        metrics.observe_handler("a", seconds)
    metrics.observe_handler("b", 0.5)
    lines = exposition(metrics)
    expected = {
        "0.01": 2,  # an observation equal to a bound is in that bucket
        "0.05": 3,
        "0.1": 3,
        "0.5": 3,
        "1.0": 3,
        "5.0": 3,
        "15.0": 4,
        "60.0": 4,
        "300.0": 4,
        "1800.0": 4,
        "+Inf": 5,
    }
    for le, count in expected.items():
        assert f'runlane_worker_handler_seconds_bucket{{agent="a",le="{le}"}} {count}.0' in lines
    assert 'runlane_worker_handler_seconds_count{agent="a"} 5.0' in lines
    assert 'runlane_worker_handler_seconds_sum{agent="a"} 4007.034' in lines
    assert 'runlane_worker_handler_seconds_bucket{agent="b",le="0.1"} 0.0' in lines
    assert 'runlane_worker_handler_seconds_bucket{agent="b",le="0.5"} 1.0' in lines
    assert "# TYPE runlane_worker_handler_seconds histogram" in lines


def test_ended_attempts_are_counted_by_outcome() -> None:
    metrics = WorkerMetrics()
    for outcome in ("completed", "completed", "retry"):
        metrics.count_finished(outcome)
    lines = exposition(metrics)
    assert 'runlane_worker_attempts_finished_total{outcome="completed"} 2.0' in lines
    assert 'runlane_worker_attempts_finished_total{outcome="retry"} 1.0' in lines
    assert "# TYPE runlane_worker_attempts_finished_total counter" in lines
