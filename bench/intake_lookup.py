"""What a lane intake's look for a parked worker costs when nobody is
parked, and whether the churn of ``standing_claims`` adds to it.

    python -m bench.intake_lookup [--n 2000] [--runs 4] [--churn 2000] [--tag _s16]

Since migration 0026, the lane dispatch looks in ``standing_claims`` for a
parked worker before it inserts a lane's run (outside the relay): since
0048 in ``runlane.dispatch_request``, which the intake calls for its own
request and ``runlane.dispatch_head`` for a lane's head. This measures
lane submits (``submit_request``, the statement behind ``POST
/v1/threads/{t}/requests``), each to a new thread so that each lane is
idle and its request dispatched at intake, back to back from one
connection, with no worker parked, in three states of
``standing_claims`` and two versions of ``dispatch_request``:

- ``fresh``: the table truncated and vacuumed;
- ``churned``: after ``--churn`` park / unpark cycles of four workers
  (``claim_or_park`` that parks, then the unpark's DELETE), nothing
  vacuumed, as in a benchmark database with autovacuum off;
- ``vacuumed``: the same after VACUUM;
- in each state, ``dispatch_request`` as migrated (``look``) and the same
  function with its look switched off (``no look``: the run inserted
  pending, as before 0026), the latter made in this benchmark's database
  only.

Each cell is the median latency of ``--n`` submits (the first 100 of each
left out), the kinds alternating within each of ``--runs`` rounds.
Back to back, a difference here is PostgreSQL's work (and no pause makes
it slower). With ``--connections C`` (the API's pool holds 20), C
connections submit ``--n`` each at once and a cell is the wall time per
submit of them all, so that contention between backends shows.
Results: ``bench/results/intake_lookup{tag}.json``.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench.common import bench_database, median, print_table, write_results

STATES = ["fresh", "churned", "vacuumed"]
VERSIONS = ["look", "no look"]
# The look as migration 0026 writes it; "no look" switches it off.
LOOK = "IF pg_trigger_depth() = 0"


def _submit_params() -> dict[str, Any]:
    # What LaneService.submit sends for a request to a new thread.
    return {
        "tenant": "t",
        "user_id": "u",
        "agent": "bench-intake",
        "thread_id": uuid.uuid4().hex,
        "request_id": uuid.uuid4().hex,
        "policy": "enqueue",
        "input": Jsonb({"i": 1}),
        "priority": 0,
        "max_attempts": 3,
        "budget": Jsonb({}),
        "metadata": Jsonb({}),
    }


def churn(conn: psycopg.Connection[Any], cycles: int) -> None:
    """Park / unpark cycles, as idle workers of another agent make them."""
    from runlane.queries import named_queries
    from runlane.store import ClaimSpec

    park = named_queries()["claim_or_park"]
    for i in range(cycles):
        worker_id = f"bench-churn-{i % 4}"
        spec = ClaimSpec(
            worker_id=worker_id,
            limit=10,
            lease_seconds=30.0,
            agents=["bench-nobody"],
            park_seconds=60.0,
        )
        conn.execute(park, spec.params(), prepare=True).fetchall()
        conn.execute(
            "DELETE FROM runlane.standing_claims WHERE worker_id = %s", (worker_id,), prepare=True
        )


def submits(url: str, n: int, connections: int = 1) -> float:
    """Median seconds of n back-to-back lane submits on a new connection;
    with more connections, each sends n at once with the others, and the
    answer is the wall time per submit of them all (1 / throughput)."""
    from runlane.queries import named_queries

    query = named_queries("lanes.sql")["submit_request"]

    def one_connection(seconds: list[float]) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(n):
                before = time.perf_counter()
                conn.execute(query, _submit_params(), prepare=True).fetchall()
                seconds.append(time.perf_counter() - before)

    if connections == 1:
        seconds: list[float] = []
        one_connection(seconds)
        return median(seconds[min(100, n // 2) :])
    threads = [threading.Thread(target=one_connection, args=([],)) for _ in range(connections)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return (time.perf_counter() - started) / (n * connections)


def run(
    n: int,
    runs: int,
    churn_cycles: int,
    *,
    connections: int = 1,
    tag: str = "",
    out_dir: Path | None = None,
) -> dict[str, Any]:
    cells: dict[str, list[float]] = {f"{s} / {v}": [] for s in STATES for v in VERSIONS}
    sizes: list[dict[str, Any]] = []
    with bench_database("intake_lookup") as url, psycopg.connect(url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT pg_get_functiondef('runlane.dispatch_request'::regproc)"
        ).fetchone()
        assert row is not None
        functions = {
            "look": str(row[0]),
            "no look": str(row[0]).replace(LOOK, f"IF false AND {LOOK[3:]}"),
        }
        if functions["no look"] == functions["look"]:
            raise RuntimeError("dispatch_request has no look for a parked worker to switch off")
        for rnd in range(runs):
            for state in STATES:
                if state == "fresh":
                    admin.execute("TRUNCATE runlane.standing_claims")
                    admin.execute("VACUUM runlane.standing_claims")
                elif state == "churned":
                    churn(admin, churn_cycles)
                    size = admin.execute(
                        "SELECT pg_relation_size('runlane.standing_claims'),"
                        " pg_relation_size('runlane.standing_claims_pkey')"
                    ).fetchone()
                    assert size is not None
                    sizes.append({"round": rnd, "table_bytes": size[0], "index_bytes": size[1]})
                else:
                    admin.execute("VACUUM runlane.standing_claims")
                # Alternate which version goes first, round by round.
                order = VERSIONS if rnd % 2 == 0 else VERSIONS[::-1]
                for version in order:
                    admin.execute(functions[version])
                    cells[f"{state} / {version}"].append(submits(url, n, connections))
            print(
                f"round {rnd}: "
                + ", ".join(f"{k} {v[-1] * 1000:.3f} ms" for k, v in cells.items()),
                flush=True,
            )
        admin.execute(functions["look"])
    medians = {k: median(v) * 1000 for k, v in cells.items()}
    table = print_table(
        ["standing_claims", "look p50 ms", "no look p50 ms", "look - no look ms"],
        [
            [
                state,
                medians[f"{state} / look"],
                medians[f"{state} / no look"],
                medians[f"{state} / look"] - medians[f"{state} / no look"],
            ]
            for state in STATES
        ],
    )
    data = {
        "n": n,
        "runs": runs,
        "churn": churn_cycles,
        "connections": connections,
        "rounds_ms": {k: [x * 1000 for x in v] for k, v in cells.items()},
        "medians_ms": medians,
        "churned_sizes": sizes,
        "table": table,
    }
    write_results(f"intake_lookup{tag}", data, out_dir=out_dir)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.intake_lookup")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--churn", type=int, default=2000, help="park / unpark cycles")
    parser.add_argument(
        "--connections",
        type=int,
        default=1,
        help="submitting connections at once (then each cell is wall time per submit)",
    )
    parser.add_argument("--tag", default="")
    parser.add_argument("--out-dir", type=Path, default=None, help="default bench/results")
    args = parser.parse_args()
    run(
        args.n,
        args.runs,
        args.churn,
        connections=args.connections,
        tag=args.tag,
        out_dir=args.out_dir,
    )


if __name__ == "__main__":
    main()
