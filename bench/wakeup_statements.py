"""The statements on an idle worker's wake-up path, runlane's against bare
SQL's, each sent after the same pause.

    python -m bench.wakeup_statements [--n 300] [--gap-ms 20] [--tag _s12]

Figure 2's wake-up is, in the database, one committed statement when the
worker is parked (standing claims: the submit claims the run for it and
its NOTIFY carries the run), and two on the pull path (the submit, an
INSERT with its NOTIFY, then the worker's claim). This measures each on
its own, from one client connection per statement kind, as the
round trip of one execution after ``--gap-ms`` of quiet (what an idle
worker sees; back to back, a round trip costs a fraction of it):

- ``select 1``: the round trip alone, after the same pause;
- ``runlane submit``: the store's ``insert_run`` query, as
  ``RunService.submit`` sends it (a new run, no idempotency key);
- ``floor submit``: bench.peers.sql_floor's INSERT of a narrow row with its
  NOTIFY;
- ``runlane push submit``: the same ``insert_run`` with a worker parked
  for its agent (its standing claim written before the pause, untimed):
  the submit takes the claim and inserts the run running, with its
  attempt row and the ``runlane_push`` NOTIFY carrying it;
- ``push-floor submit``: bench.peers.sql_push_floor's submit with a worker
  parked (its row written before the pause);
- ``runlane claim``: the store's ``claim_batch`` query (limit 10, one
  agent) with one pending run waiting;
- ``floor claim``: sql_floor's claiming UPDATE with one unclaimed row.

The kinds take turns within each of ``--n`` rounds (so slow spells of the
shared machine fall on all of them); a claim's pending row is inserted
before its pause, untimed. Prepared statements, autocommit, as runlane's
worker and the floor send them. Results:
``bench/results/wakeup_statements{tag}.json``.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench.common import AGENT, bench_database, latency_summary, print_table, write_results
from bench.peers import sql_floor, sql_push_floor

# The timed submits' runs: an agent the timed claims never take.
SUBMIT_ONLY_AGENT = "bench-submit-only"
# The pushing submits' runs: an agent with no run ever waiting (a run
# waiting for the agent would be claimed first, and no push happen).
PUSH_ONLY_AGENT = "bench-push-only"
# Measured kinds, in the order the table lists them.
KINDS = [
    "select 1",
    "runlane submit",
    "floor submit",
    "runlane push submit",
    "push-floor submit",
    "runlane claim",
    "floor claim",
]
# Each of runlane's statements beside the bare-SQL statement it is compared with.
FLOOR_OF = {
    "runlane submit": "floor submit",
    "runlane push submit": "push-floor submit",
    "runlane claim": "floor claim",
}


def _submit_params(agent: str) -> dict[str, Any]:
    # What RunService.submit sends for a plain submit.
    from runlane.store import NewRun

    return NewRun(agent=agent, input={"n": 1}, max_attempts=3).params(notify=True)


def _park_params(worker_id: str) -> dict[str, Any]:
    # What an idle worker of the pushing submits' agent sends to park.
    from runlane.store import ClaimSpec

    return ClaimSpec(
        worker_id=worker_id,
        limit=10,
        lease_seconds=30.0,
        agents=[PUSH_ONLY_AGENT],
        park_seconds=60.0,
    ).params()


def _claim_params(worker_id: str) -> dict[str, Any]:
    # What the worker sends for one agent.
    from runlane.store import ClaimSpec

    return ClaimSpec(worker_id=worker_id, limit=10, lease_seconds=30.0, agents=[AGENT]).params()


def measure(url: str, n: int, gap: float) -> dict[str, list[float]]:
    from runlane.queries import named_queries

    sql = named_queries()
    worker_id = f"bench-{uuid.uuid4().hex[:8]}"
    parked_worker_id = f"bench-parked-{uuid.uuid4().hex[:8]}"
    samples: dict[str, list[float]] = {kind: [] for kind in KINDS}
    sql_push_floor.setup(url)
    with (
        psycopg.connect(url, autocommit=True) as submitter,
        psycopg.connect(url, autocommit=True) as claimer,
        psycopg.connect(url, autocommit=True) as feeder,
        # A listener, so that each NOTIFY is delivered as on the real path.
        psycopg.connect(url, autocommit=True) as listener,
    ):
        listener.execute("LISTEN runlane_wakeup")
        listener.execute("LISTEN runlane_push")
        listener.execute(f"LISTEN {sql_floor.CHANNEL}")
        listener.execute(f"LISTEN {sql_push_floor.PUSH_CHANNEL}")

        def feed_runlane() -> None:
            feeder.execute(sql["insert_run"], _submit_params(AGENT), prepare=True).fetchall()

        def feed_floor() -> None:
            feeder.execute(sql_floor.SUBMIT, (time.time(),), prepare=True).fetchall()

        def park_runlane() -> None:
            # A parked worker's claim (nothing pending for its agent, so
            # it parks), as the worker sends it.
            feeder.execute(
                sql["claim_or_park"], _park_params(parked_worker_id), prepare=True
            ).fetchall()

        def park_floor() -> None:
            feeder.execute(sql_push_floor.PARK, (parked_worker_id,), prepare=True)

        steps: dict[str, tuple[Callable[[], None] | None, Callable[[], Any]]] = {
            "select 1": (None, lambda: submitter.execute("SELECT 1", prepare=True).fetchall()),
            "runlane submit": (
                None,
                lambda: submitter.execute(
                    sql["insert_run"], _submit_params(SUBMIT_ONLY_AGENT), prepare=True
                ).fetchall(),
            ),
            "floor submit": (
                None,
                lambda: submitter.execute(
                    sql_floor.SUBMIT, (time.time(),), prepare=True
                ).fetchall(),
            ),
            "runlane push submit": (
                park_runlane,
                lambda: submitter.execute(
                    sql["insert_run"], _submit_params(PUSH_ONLY_AGENT), prepare=True
                ).fetchall(),
            ),
            "push-floor submit": (
                park_floor,
                lambda: submitter.execute(
                    sql_push_floor.SUBMIT, (time.time(),), prepare=True
                ).fetchall(),
            ),
            "runlane claim": (
                feed_runlane,
                lambda: claimer.execute(
                    sql["claim_batch"], _claim_params(worker_id), prepare=True
                ).fetchall(),
            ),
            "floor claim": (
                feed_floor,
                lambda: claimer.execute(sql_floor.CLAIM, (10,), prepare=True).fetchall(),
            ),
        }
        for round_no in range(n):
            # Each round starts with a different kind: none is always
            # the first after the previous round's work.
            order = KINDS[round_no % len(KINDS) :] + KINDS[: round_no % len(KINDS)]
            for kind in order:
                before, timed = steps[kind]
                if before is not None:
                    before()
                time.sleep(gap)
                start = time.perf_counter()
                rows = timed()
                elapsed = time.perf_counter() - start
                if kind.endswith("claim") and len(rows) != 1:
                    raise RuntimeError(f"{kind} claimed {len(rows)} rows, not 1")
                samples[kind].append(elapsed)
                if kind in ("floor submit", "push-floor submit"):
                    # Out of the floor claim's way (runlane's submits
                    # are for an agent its claim does not take).
                    feeder.execute("DELETE FROM sql_floor_jobs WHERE NOT claimed")
            # Drain the listener's socket, off the clock.
            for _ in listener.notifies(timeout=0):
                pass
        # Every pushing submit found its standing claim: none of its runs
        # waits pending.
        waiting = feeder.execute(
            "SELECT count(*) FROM runlane.runs WHERE agent = %s AND status <> 'running'",
            (PUSH_ONLY_AGENT,),
        ).fetchone()
        if waiting is None or waiting[0] != 0:
            raise RuntimeError(f"{waiting} pushing submits found no standing claim")
    return samples


def run(n: int, gap_ms: float, *, tag: str = "", out_dir: Path | None = None) -> dict[str, Any]:
    with bench_database("wakeup_statements") as url:
        samples = measure(url, n, gap_ms / 1000.0)
    summary = {kind: latency_summary(values) for kind, values in samples.items()}
    table = print_table(
        ["statement", "p50 ms", "p90 ms", "p99 ms", "p50 over floor ms"],
        [
            [
                kind,
                v["p50_ms"],
                v["p90_ms"],
                v["p99_ms"],
                v["p50_ms"] - summary[FLOOR_OF[kind]]["p50_ms"] if kind in FLOOR_OF else "",
            ]
            for kind, v in summary.items()
        ],
    )
    data = {"n": n, "gap_ms": gap_ms, "statements": summary, "table": table}
    path = write_results(f"wakeup_statements{tag}", data, out_dir=out_dir)
    print(f"results: {path}")
    return data


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wakeup_statements")
    parser.add_argument("--n", type=int, default=300, help="rounds (each kind once per round)")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="quiet before each statement")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    run(args.n, args.gap_ms, tag=args.tag, out_dir=args.out_dir)


if __name__ == "__main__":
    main()
