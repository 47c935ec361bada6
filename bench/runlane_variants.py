"""Experiments: runlane with one cost taken away, run side by side with
plain runlane in the same throughput rounds (``--systems
runlane,runlane-no-status-notify,runlane-no-aging``), so that the gain a
hot-path change would bring is a ratio measured in the same run. They
change the benchmark database or the worker's settings, never src/.

- ``runlane-no-status-notify``: the ``runs_notify_status`` trigger (one
  pg_notify per run reaching a terminal status, for the API's streams) is
  disabled for the trial. Since migration 0028 the outcome write sends
  those notifications itself and the trigger skips it, so in a burn-down
  this variant changes nothing; it is kept for the other writers' paths.
- ``runlane-no-aging``: the worker runs with priority aging off
  (``RUNLANE_PRIORITY_AGING_SECONDS=0``), so ``runlane.claim_runs`` reads
  one candidate list instead of two.
- (``runlane-free-slot-early``, an experiment of 2026-11-30 that freed a
  slot when the handler returned, is gone: the worker does that now.)
- ``runlane-batch-half``, ``runlane-batch-quarter``: the worker claims
  at most half (a quarter) of its concurrency per claim instead of all of
  it, so that handlers of one batch run while the next claim is on its
  way (a pipeline, at the price of more claims and outcome batches).
- ``runlane-no-prefetch``: the worker without claiming ahead
  (``RUNLANE_PREFETCH_HANDLER_SECONDS=0``): each claim only for free
  handler slots. (``runlane-prefetch``, the tenth session's experiment
  that held twice the concurrency behind a gate, is gone: the worker
  claims ahead itself while its handlers are short.)
- ``runlane-capped-claim``: a tenant cap on a tenant that has no runs,
  so that every claim takes ``runlane.claim_capped_runs`` (the claim of
  migration 0006: four statements planned on each call) instead of
  ``runlane.claim_uncapped_runs`` (0009): the claim change's before/after.
- ``runlane-claim-planned-each-call``: the uncapped claim planned again on
  every call (``force_custom_plan``, as before migration 0012) instead of
  keeping plans pinned to the claim indexes: 0012's before/after.
- ``runlane-listing-on-runs``: the listing indexes on runs, as before
  migration 0030, instead of the table run_listing written at the insert
  (the worker's queries never read them; every claim and outcome write
  adds entries to them): 0030's before/after.
- (``runlane-attempts-before-0033`` and ``runlane-before-0033-0034``,
  the twenty-second session's before/after of migrations 0033 and 0034,
  are gone: since migration 0035 an attempt's row is written once, at its
  end, and the claims they put back wrote it at the claim too.)
- ``runlane-attempts-at-claim``: attempt rows as before migration 0035,
  inserted by the claim (0034's) and updated by the outcome write
  (0032's), with half-filled pages (0033): 0035's before/after.
- ``runlane-python-gc``: the worker with Python's own garbage-collector
  settings (``RUNLANE_GC_THRESHOLD=0``: a collection every 700 new
  objects, nothing frozen) instead of runlane's (``runlane.collector``):
  that change's before/after.
- ``runlane-baseline``: the worker of another checkout
  (``RUNLANE_BENCH_BASELINE_SRC``, its ``src/``), for a before/after ratio
  measured in the same rounds; ``runlane-other`` the same with
  ``RUNLANE_BENCH_OTHER_SRC``, for a third code in the same rounds.
- ``runlane-no-run-changes-notify``: the latest outcome write without
  its ``pg_notify('runlane_run_changes', ...)`` (the API streams'
  wake-up; one per run until migration 0047, one per 200 ended runs
  since), which every listening backend of the database is signalled for
  and reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import psycopg

from bench import runlane_system
from bench.common import Proc


class Variant:
    def __init__(
        self,
        name: str,
        *,
        sql: str | Callable[[], str] | None = None,
        env: dict[str, str] | None = None,
        src_env: str | None = None,
        batch_divisor: int = 1,
        worker_args: tuple[str, ...] = (),
    ):
        self.NAME = name
        self.QUEUE_TABLE = runlane_system.QUEUE_TABLE
        self._sql = sql
        self._env = env
        # The name of an environment variable holding another checkout's
        # src/ whose runlane the worker imports (a before/after comparison).
        self._src_env = src_env
        # Runs per claim: the concurrency divided by this (the worker's
        # default claims as many as its concurrency).
        self._batch_divisor = batch_divisor
        self._worker_args = worker_args

    @property
    def _src(self) -> str | None:
        return os.environ.get(self._src_env) if self._src_env else None

    def available(self) -> str | None:
        if self._src_env and not self._src:
            return f"set {self._src_env} to the src/ of the checkout to compare with"
        return None

    def setup(self, url: str) -> None:
        runlane_system.setup(url)

    def reset(self, url: str) -> None:
        runlane_system.reset(url)
        if self._sql:
            sql = self._sql() if callable(self._sql) else self._sql
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(sql.encode())

    def enqueue(self, url: str, n: int) -> None:
        runlane_system.enqueue(url, n)

    def remaining(self, url: str) -> int:
        return runlane_system.remaining(url)

    def window(self, url: str) -> tuple[float, float]:
        return runlane_system.window(url)

    def steady_window(self, url: str, low: float, high: float) -> tuple[float, float]:
        return runlane_system.steady_window(url, low, high)

    def spawn_worker(self, url: str, concurrency: int, **kwargs: Any) -> Proc:
        extra = [*kwargs.get("extra", ()), *self._worker_args]
        if self._batch_divisor != 1:
            extra += ["--batch-size", str(max(1, concurrency // self._batch_divisor))]
        kwargs["extra"] = extra
        return runlane_system.spawn_worker(url, concurrency, env=self._env, src=self._src, **kwargs)


# The uncapped claim as before migration 0012: planned on every call.
UNCAPPED_CLAIM = "runlane.claim_uncapped_runs(text, text[], integer, float8, float8)"
CLAIM_PLANNED_EACH_CALL = (
    f"ALTER FUNCTION {UNCAPPED_CLAIM} RESET ALL;"
    f" ALTER FUNCTION {UNCAPPED_CLAIM} SET plan_cache_mode = force_custom_plan"
)

# The listing as before migration 0030: indexes on runs, and no listing
# rows written at the insert (run_listing stays, empty: the trigger of
# 0031 that deletes what goes with deleted runs reads it, and a
# burn-down deletes no runs). runlane_system.reset puts 0030 back.
LISTING_ON_RUNS = (
    "DROP TRIGGER runs_list_inserted ON runlane.runs;"
    " DROP TRIGGER runs_refuse_relisting ON runlane.runs;"
    " TRUNCATE runlane.run_listing;"
    " CREATE INDEX runs_listing_idx ON runlane.runs (hashtext(tenant), created_at DESC, id DESC);"
    " CREATE INDEX runs_owner_listing_idx"
    " ON runlane.runs (hashtext(tenant), hashtext(user_id), created_at DESC, id DESC);"
    " CREATE STATISTICS runlane.runs_user_hash_stats (dependencies)"
    " ON user_id, hashtext(user_id) FROM runlane.runs"
)


# Attempt rows as before migration 0035; runlane_system.reset puts 0035's
# functions back. (A burn-down reaps nothing and dispatches no lane, so the
# reaper and dispatch_head of 0035 are not on its path.)
def attempts_at_claim() -> str:
    return "; ".join(
        [
            "ALTER TABLE runlane.run_attempts SET (fillfactor = 50)",
            runlane_system.migration_function(34, "claim_uncapped_runs"),
            runlane_system.migration_function(32, "finish_attempts"),
        ]
    )


# The latest outcome write without its NOTIFY on runlane_run_changes (the
# API's streams' wake-up).
def no_run_changes_notify() -> str:
    sql = runlane_system.latest_function("finish_attempts")
    cut = """
        UNION ALL
        SELECT pg_notify('runlane_run_changes', string_agg(finished.id::text, ','))
        FROM finished
        WHERE finished.status IN ('completed', 'failed', 'dead', 'cancelled', 'interrupted')
        GROUP BY (finished.lock_order - 1) / 200"""
    assert cut in sql
    return sql.replace(cut, "")


VARIANTS = {
    "runlane-no-run-changes-notify": Variant(
        "runlane-no-run-changes-notify", sql=no_run_changes_notify
    ),
    "runlane-no-status-notify": Variant(
        "runlane-no-status-notify",
        sql="ALTER TABLE runlane.runs DISABLE TRIGGER runs_notify_status",
    ),
    "runlane-no-aging": Variant("runlane-no-aging", env={"RUNLANE_PRIORITY_AGING_SECONDS": "0"}),
    "runlane-batch-half": Variant("runlane-batch-half", batch_divisor=2),
    "runlane-batch-quarter": Variant("runlane-batch-quarter", batch_divisor=4),
    "runlane-no-prefetch": Variant(
        "runlane-no-prefetch", env={"RUNLANE_PREFETCH_HANDLER_SECONDS": "0"}
    ),
    "runlane-capped-claim": Variant(
        "runlane-capped-claim",
        sql="INSERT INTO runlane.tenant_limits (tenant, max_running) VALUES ('nobody', 1)",
    ),
    "runlane-claim-planned-each-call": Variant(
        "runlane-claim-planned-each-call", sql=CLAIM_PLANNED_EACH_CALL
    ),
    "runlane-listing-on-runs": Variant("runlane-listing-on-runs", sql=LISTING_ON_RUNS),
    "runlane-attempts-at-claim": Variant("runlane-attempts-at-claim", sql=attempts_at_claim),
    "runlane-python-gc": Variant("runlane-python-gc", env={"RUNLANE_GC_THRESHOLD": "0"}),
    # The same worker from another checkout, in the same rounds:
    # RUNLANE_BENCH_BASELINE_SRC=/tmp/runlane-base/src (`git worktree add
    # /tmp/runlane-base <commit>`).
    "runlane-baseline": Variant("runlane-baseline", src_env="RUNLANE_BENCH_BASELINE_SRC"),
    "runlane-other": Variant("runlane-other", src_env="RUNLANE_BENCH_OTHER_SRC"),
}
