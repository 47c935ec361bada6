"""The garbage collector of a worker's or the HTTP API's process, set for
many short-lived objects.

Each run a worker claims makes a few dozen container objects (its row,
its ``Run``, its execution and context, a task, a future) that live until
its outcome is written. With Python's default threshold (700 new objects)
a worker at concurrency 200 collected the youngest generation every ~35
runs, and every few hundred collections went through every object
loaded at start (~48,000: the libraries, the app), 16 ms each time.
Measured with ``bench.worker_cpu`` (twenty-third session, BENCHMARKS.md
section 1): 42 us of the worker's CPU per no-op run at concurrency 200,
7 of them in the collector; 33-37 us with the settings below.

Runs' objects are freed by reference counting as soon as their outcome is
written; the collector is only for reference cycles, which the hot path
does not make, so collecting them less often costs little memory (at
most ``threshold`` objects more before the next collection). The API's
requests are alike: with these settings its submits' p99 fell from 80 to
61-64 ms in alternating runs of ``bench.api``, since no request waits for
a full collection any more.
"""

from __future__ import annotations

import gc
import logging

logger = logging.getLogger(__name__)

_tuned = False


def tune_collector(threshold: int) -> None:
    """Once per process (the first worker or API to start): moves every object
    loaded so far out of the collector's view (``gc.freeze()``: they are
    never scanned again, though still freed when no longer referenced) and
    collects the youngest generation after ``threshold`` new objects
    instead of Python's 700. ``threshold`` 0 leaves the collector as it
    is."""
    global _tuned
    if threshold <= 0 or _tuned:
        return
    _tuned = True
    # What is garbage now is collected before the rest is frozen for good.
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)
    logger.debug(
        "garbage collector: %d objects frozen, threshold %d", gc.get_freeze_count(), threshold
    )
