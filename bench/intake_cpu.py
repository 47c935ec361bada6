"""PostgreSQL's CPU per lane submit: ``runlane.submit_request``, the one
statement behind ``POST /v1/threads/{t}/requests``, with two schemas
alternating.

    python -m bench.intake_cpu [--n 3000] [--runs 5] [--tag _s38] [--out-dir DIR]
    python -m bench.intake_cpu --instructions [--loops 100,400] [--pg-bin DIR]
        [--before-up-to 47] [--tag _s38]

Each round makes a new database per schema, ``before`` (migrations up to
0047) and ``after`` (every migration; 0048 runs fewer statements per
submit, 0049 per relay), and in each calls the function ``--n`` times from one
connection, each call its own transaction as the API's are, in two cases:

- ``new thread``: every submit to a new thread, so a new lane whose
  request is dispatched at once (the API benchmark's case, section 6);
- ``busy lane``: submits into 300 lanes whose run is active (no worker
  runs), round robin, each queued behind it with its position answered.

Reported per submit: the backend's CPU (``/proc``, user + system, over
the ``--n`` calls) and the client's wait (median). No HTTP, no pool, no
Python of the API: what the schema change alone does. Results:
``bench/results/intake_cpu{tag}.json``.

With ``--instructions`` the same two cases are counted by callgrind
instead, as ``bench.backend_instructions`` counts (two throwaway
clusters, one per schema, served by ``postgres --single``; per call,
(I(N2) - I(N1)) / (N2 - N1) for the two ``--loops``), which shows a few
per cent that CPU times on a shared machine cannot; and two more cases:
``head dispatched``, ``runlane.dispatch_head`` of an idle lane's queued
request, as recovery calls it; ``relay``, a lane's run set completed with
a request waiting, its trigger's relay dispatching it. ``--before-up-to``
sets the schema counted as ``before`` (0047 unless given), to count what
a later migration added. Results:
``bench/results/intake_instructions{tag}.json``.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

from bench.backend_instructions import (
    Cluster,
    embedded_bin,
    postgres_version,
    throwaway_clusters,
)
from bench.common import (
    bench_database,
    median,
    print_table,
    process_cpu_seconds,
    write_results,
)

# The last migration before the intake ran fewer statements (0048).
BEFORE_UP_TO = 47
SCHEMAS = {"before": BEFORE_UP_TO, "after": None}
CASES = ("new thread", "busy lane")
BUSY_LANES = 300

SUBMIT = (
    "SELECT * FROM runlane.submit_request("
    "'default', 'default', 'bench', %s, %s, 'enqueue', '{}'::jsonb, 0, 3, '{}'::jsonb,"
    " '{}'::jsonb)"
)


def measure(url: str, case: str, n: int) -> dict[str, float]:
    prefix = uuid.uuid4().hex[:8]
    with psycopg.connect(url, autocommit=True) as conn:
        if case == "new thread":
            threads = [f"{prefix}-{i}" for i in range(n)]
        else:
            # Each busy lane's first request is dispatched: its run stays
            # pending (no worker), so the lane is busy from then on.
            lanes = [f"{prefix}-busy-{i}" for i in range(BUSY_LANES)]
            for thread in lanes:
                conn.execute(SUBMIT, (thread, f"{thread}-first"), prepare=True)
            threads = [lanes[i % BUSY_LANES] for i in range(n)]
        # Plans made and kept before the count starts.
        for i in range(10):
            conn.execute(SUBMIT, (f"{prefix}-warm-{i}", f"{prefix}-warm-{i}"), prepare=True)
        pid = conn.info.backend_pid
        waits = []
        cpu_before = process_cpu_seconds(pid)
        for i, thread in enumerate(threads):
            started = time.perf_counter()
            conn.execute(SUBMIT, (thread, f"{prefix}-{i}"), prepare=True).fetchall()
            waits.append(time.perf_counter() - started)
        cpu = process_cpu_seconds(pid) - cpu_before
    return {"backend_cpu_us": cpu / n * 1e6, "wait_us": median(waits) * 1e6}


def one_round(up_to: int | None, n: int) -> dict[str, dict[str, float]]:
    from runlane.migrations import migrate

    results = {}
    for case in CASES:
        with bench_database("intake_cpu", runlane_schema=False) as url:
            migrate(url, up_to=up_to)
            results[case] = measure(url, case, n)
    return results


def run(n: int, runs: int, *, tag: str = "", out_dir: Path | None = None) -> dict[str, Any]:
    trials: list[dict[str, Any]] = []
    for rnd in range(runs):
        for schema, up_to in SCHEMAS.items():
            result = one_round(up_to, n)
            for case, values in result.items():
                trials.append({"round": rnd, "schema": schema, "case": case, **values})
            print(f"round {rnd} {schema}: {json.dumps(result)}", flush=True)
    rows = []
    medians: dict[str, dict[str, dict[str, float]]] = {}
    for case in CASES:
        medians[case] = {}
        for schema in SCHEMAS:
            picked = [t for t in trials if t["case"] == case and t["schema"] == schema]
            medians[case][schema] = {
                key: median([t[key] for t in picked]) for key in ("backend_cpu_us", "wait_us")
            }
        # The ratio of each round's pair, then their median: the rounds
        # drift together on a shared machine.
        # (A round too short for /proc's 10 ms ticks reads 0: left out.)
        ratios = [
            after["backend_cpu_us"] / before["backend_cpu_us"]
            for before, after in zip(
                [t for t in trials if t["case"] == case and t["schema"] == "before"],
                [t for t in trials if t["case"] == case and t["schema"] == "after"],
                strict=True,
            )
            if before["backend_cpu_us"] > 0
        ]
        ratio = median(ratios) if ratios else float("nan")
        medians[case]["after / before"] = {"backend_cpu_us": ratio}
        rows.append(
            [
                case,
                medians[case]["before"]["backend_cpu_us"],
                medians[case]["after"]["backend_cpu_us"],
                ratio,
                medians[case]["before"]["wait_us"],
                medians[case]["after"]["wait_us"],
            ]
        )
    table = print_table(
        [
            "case",
            "backend CPU us/submit, before",
            "after",
            "after / before (median of rounds' ratios)",
            "client wait us, before",
            "after",
        ],
        rows,
    )
    data = {
        "n": n,
        "runs": runs,
        "before_up_to": BEFORE_UP_TO,
        "trials": trials,
        "medians": medians,
        "table": table,
    }
    write_results(f"intake_cpu{tag}", data, out_dir=out_dir)
    return data


# One submit per statement in single-user mode, each its own transaction;
# a sequence names the threads (new thread) or picks the busy lane.
INSTRUCTION_SUBMITS = {
    "new thread": "SELECT * FROM runlane.submit_request('default', 'default', 'bench',"
    " 'n-' || nextval('bench_submits'), 'n-' || currval('bench_submits'), 'enqueue',"
    " '{}'::jsonb, 0, 3, '{}'::jsonb, '{}'::jsonb)",
    "busy lane": "SELECT * FROM runlane.submit_request('default', 'default', 'bench',"
    f" 'busy-' || nextval('bench_submits') % {BUSY_LANES}, 'b-' || currval('bench_submits'),"
    " 'enqueue', '{}'::jsonb, 0, 3, '{}'::jsonb, '{}'::jsonb)",
    # Not a submit: the dispatch of a lane's head as the relay and recovery
    # make it, through runlane.dispatch_head, one of HEAD_LANES lanes left
    # idle with a request queued (prepare_cluster) each time.
    "head dispatched": "SELECT runlane.dispatch_head(l.id) FROM runlane.lanes AS l"
    " WHERE l.tenant = 'default' AND l.user_id = 'default' AND l.agent = 'bench'"
    # (The volatile nextval in a subquery, so that the lane is found by its
    # unique index rather than by reading every lane.)
    " AND l.thread_id = (SELECT 'head-' || nextval('bench_heads'))",
    # A lane's run ending completed, with a request waiting: the outcome's
    # row update and the relay its trigger runs (runlane.relay_lane), which
    # dispatches the request. One of HEAD_LANES lanes each time.
    "relay": "UPDATE runlane.runs SET status = 'completed', finished_at = now()"
    " WHERE status = 'pending' AND lane_id = (SELECT l.id FROM runlane.lanes AS l"
    " WHERE l.tenant = 'default' AND l.user_id = 'default' AND l.agent = 'bench'"
    " AND l.thread_id = (SELECT 'relay-' || nextval('bench_relays')))",
}
# Enough lanes for the longer loop.
HEAD_LANES = 1000


def prepare_cluster(cluster: Cluster, up_to: int | None) -> None:
    """Migrated up to ``up_to``, with its busy lanes (each one's first
    request dispatched), as many new-thread submits of history, and
    HEAD_LANES lanes left idle with one request queued: their first run
    ended without its relay (triggers off), as a crash could leave it; and
    HEAD_LANES lanes whose run is pending with one request queued."""
    from runlane.migrations import migrate

    cluster.init()
    cluster.start()
    try:
        migrate(cluster.url(), up_to=up_to)
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute("CREATE SEQUENCE bench_submits")
            for _ in range(BUSY_LANES):
                conn.execute(INSTRUCTION_SUBMITS["busy lane"])
                conn.execute(INSTRUCTION_SUBMITS["new thread"])
            conn.execute("CREATE SEQUENCE bench_heads")
            conn.execute("CREATE SEQUENCE bench_relays")
            for i in range(1, HEAD_LANES + 1):
                for thread in (f"head-{i}", f"relay-{i}"):
                    for request in ("first", "queued"):
                        conn.execute(
                            "SELECT FROM runlane.submit_request('default', 'default', 'bench',"
                            " %s, %s, 'enqueue', '{}'::jsonb, 0, 3, '{}'::jsonb, '{}'::jsonb)",
                            (thread, f"{thread}-{request}"),
                        )
            with conn.transaction():
                conn.execute("SET LOCAL session_replication_role = replica")
                conn.execute(
                    "UPDATE runlane.runs SET status = 'completed', finished_at = now()"
                    " WHERE thread_id LIKE 'head-%'"
                )
            conn.execute("VACUUM ANALYZE")
            conn.execute("CHECKPOINT")
    finally:
        cluster.stop()


def count_instructions(
    loops: tuple[int, int],
    pg_bin: Path,
    *,
    before_up_to: int = BEFORE_UP_TO,
    tag: str = "",
    out_dir: Path | None = None,
) -> dict[str, Any]:
    few, many = loops
    schemas = {"before": before_up_to, "after": None}
    with throwaway_clusters(schemas, pg_bin, "runlane-intake-instructions-") as clusters:
        for schema, cluster in clusters.items():
            prepare_cluster(cluster, schemas[schema])
        with ThreadPoolExecutor(2) as pool:
            jobs = {
                f"{schema}_{case}_{n}": pool.submit(
                    cluster.count,
                    f"PREPARE submit AS {statement};\n\n" + "EXECUTE submit;\n\n" * n,
                    f"{case.replace(' ', '_')}{n}",
                )
                for schema, cluster in clusters.items()
                for case, statement in INSTRUCTION_SUBMITS.items()
                for n in loops
            }
            totals = {key: job.result() for key, job in jobs.items()}
    per_submit = {
        case: {
            schema: round(
                (totals[f"{schema}_{case}_{many}"] - totals[f"{schema}_{case}_{few}"])
                / (many - few)
            )
            for schema in schemas
        }
        for case in INSTRUCTION_SUBMITS
    }
    ratios = {
        case: round(values["after"] / values["before"], 4) for case, values in per_submit.items()
    }
    table = print_table(
        ["instructions per call", "before", "after", "after / before"],
        [[case, v["before"], v["after"], ratios[case]] for case, v in per_submit.items()],
    )
    version = postgres_version(pg_bin)
    data = {
        "benchmark": "instructions of a PostgreSQL backend (single-user mode, callgrind) per"
        " runlane.submit_request call (prepared), per runlane.dispatch_head of an idle"
        " lane's queued head, and per relay (a lane's run set completed, a request"
        f" waiting), migrations up to {before_up_to:04d} against all",
        "postgres": version,
        "before_up_to": before_up_to,
        "loops": list(loops),
        "instructions": totals,
        "instructions_per_submit": per_submit,
        "after_over_before": ratios,
        "table": table,
    }
    write_results(f"intake_instructions{tag}", data, out_dir=out_dir)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.intake_cpu")
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--instructions", action="store_true", help="count with callgrind")
    parser.add_argument("--loops", default="100,400", help="two loop counts, fewer first")
    parser.add_argument("--pg-bin", type=Path, default=None, help="PostgreSQL's bin folder")
    parser.add_argument(
        "--before-up-to",
        type=int,
        default=BEFORE_UP_TO,
        help="with --instructions, the last migration of the schema counted as before",
    )
    args = parser.parse_args()
    if args.instructions:
        few, many = (int(n) for n in args.loops.split(","))
        if not 0 < few < many:
            parser.error("--loops takes two counts, the fewer first")
        count_instructions(
            (few, many),
            args.pg_bin or embedded_bin(),
            before_up_to=args.before_up_to,
            tag=args.tag,
            out_dir=args.out_dir,
        )
        return
    run(args.n, args.runs, tag=args.tag, out_dir=args.out_dir)


if __name__ == "__main__":
    main()
