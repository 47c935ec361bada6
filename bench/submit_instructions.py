"""PostgreSQL's instructions per submit, counted by callgrind.

    python -m bench.submit_instructions [--base-queries FILE] [--queries FILE]
                                        [--sql SQL | --sql-file FILE]
                                        [--loops 30,130] [--pg-bin DIR]
                                        [--tag _s36] [--out-dir DIR]

What one ``RunService.submit`` costs the database: the store's
``insert_run`` statement (a run with no idempotency key), sent as a client
sends it, prepared once and executed again and again. Two cases:

- ``plain``: no worker is parked, so the run is inserted pending and
  ``runlane_wakeup`` is sent (a submit while the workers are busy);
- ``push``: a worker is parked before each submit (its standing claim
  written as a park leaves it, by a statement counted in both columns), so
  the submit takes the claim, inserts the run running and sends the run in
  ``runlane_push`` (the idle wake-up of figure 2).

Two throwaway clusters (as bench.backend_instructions makes them, with 300
submits of history, then VACUUM ANALYZE and CHECKPOINT): ``base`` runs the
``insert_run`` of ``--base-queries`` (a queries.sql, say another commit's:
``git show REV:src/runlane/sql/queries.sql``; default this checkout's), ``exp``
the one of ``--queries`` (default this checkout's) on the schema with
``--sql`` applied. Each loop count N runs ``PREPARE`` and N executions in
``postgres --single`` under callgrind; instructions per submit are (I(N2) -
I(N1)) / (N2 - N1). A single-user backend prints each row it answers (the
submit answers the run), which a client connection would send instead; both
columns pay it alike. Results: ``bench/results/submit_instructions{tag}.json``.
"""

from __future__ import annotations

import argparse
import time
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
from bench.common import print_table, write_results

MODES = ("plain", "push")
# The agent of the pushing submits: the parked worker's, with no run of it
# ever waiting (a waiting run would be claimed first, and no push happen).
PUSH_AGENT = "bench-push"
PLAIN_AGENT = "bench-plain"
# A standing claim as a worker's park leaves it (runlane.claim_or_park),
# written again before each pushing submit.
PARK = (
    "INSERT INTO runlane.standing_claims (worker_id, agents, lease_seconds, expires_at) "
    f"VALUES ('bench-worker', ARRAY['{PUSH_AGENT}'], 60, now() + interval '1 hour') "
    "ON CONFLICT (worker_id) DO UPDATE "
    "SET run_id = NULL, lease_token = NULL, expires_at = excluded.expires_at"
)
HISTORY = 300


def insert_run_of(queries_file: Path | None) -> str:
    from runlane.queries import named_queries, parse_named_queries

    if queries_file is None:
        return named_queries()["insert_run"]
    return parse_named_queries(queries_file.read_text())["insert_run"]


def _one_line(sql: str) -> str:
    # postgres --single -j ends a statement at a semicolon before an empty
    # line: comments and line breaks go.
    lines = (line for line in sql.splitlines() if not line.strip().startswith("--"))
    return " ".join(" ".join(lines).split())


def _statement(conn: psycopg.Connection[Any], insert_run: str, mode: str) -> str:
    """insert_run with a submit's parameters, as literals."""
    from runlane.store import NewRun

    agent = PUSH_AGENT if mode == "push" else PLAIN_AGENT
    params = NewRun(agent=agent, input={"n": 1}, max_attempts=3).params(notify=True)
    return _one_line(psycopg.ClientCursor(conn).mogrify(insert_run, params))


def prepare(
    cluster: Cluster, sql: str | None, insert_run: str, history: int = HISTORY
) -> dict[str, str]:
    """The cluster migrated, with the experiment's SQL and a history of
    submits; the statement of each mode."""
    from runlane.migrations import migrate

    cluster.init()
    cluster.start()
    try:
        migrate(cluster.url())
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            if sql:
                with conn.transaction():
                    conn.execute(sql.encode())
            statements = {mode: _statement(conn, insert_run, mode) for mode in MODES}
            for _ in range(history):
                conn.execute(PARK)
                conn.execute(statements["push"].encode())
                conn.execute(statements["plain"].encode())
            conn.execute("VACUUM ANALYZE")
            conn.execute("CHECKPOINT")
    finally:
        cluster.stop()
    return statements


def loop(statement: str, mode: str, n: int) -> str:
    each = (f"{PARK};\n\n" if mode == "push" else "") + "EXECUTE submit;\n\n"
    return f"PREPARE submit AS {statement};\n\n" + each * n


def run(
    *,
    base_queries: Path | None,
    queries: Path | None,
    sql: str | None,
    loops: tuple[int, int],
    pg_bin: Path,
    tag: str = "",
    out_dir: Path | None = None,
    history: int = HISTORY,
) -> dict[str, Any]:
    started = time.monotonic()
    few, many = loops
    texts = {"base": insert_run_of(base_queries), "exp": insert_run_of(queries)}
    with throwaway_clusters(("base", "exp"), pg_bin, "runlane-submit-instructions-") as clusters:
        statements = {
            name: prepare(cluster, sql if name == "exp" else None, texts[name], history)
            for name, cluster in clusters.items()
        }
        with ThreadPoolExecutor(2) as pool:
            jobs = {
                (name, mode, n): pool.submit(
                    cluster.count, loop(statements[name][mode], mode, n), f"{mode}{n}"
                )
                for name, cluster in clusters.items()
                for mode in MODES
                for n in loops
            }
            totals = {f"{name}_{mode}_{n}": job.result() for (name, mode, n), job in jobs.items()}
    per_submit = {
        mode: {
            name: round(
                (totals[f"{name}_{mode}_{many}"] - totals[f"{name}_{mode}_{few}"]) / (many - few)
            )
            for name in clusters
        }
        for mode in MODES
    }
    version = postgres_version(pg_bin)
    data: dict[str, Any] = {
        "benchmark": "instructions of a PostgreSQL backend (single-user mode, callgrind) per"
        " submit (insert_run, prepared): plain (no worker parked) and push (a worker parked"
        " before each submit, its park counted in both columns); base against exp",
        "postgres": version,
        "synchronous_commit": "not applicable (a single-user backend, fsync off)",
        "base_queries": str(base_queries) if base_queries else "this checkout",
        "queries": str(queries) if queries else "this checkout",
        "sql": sql,
        "loops": list(loops),
        "history": history,
        "instructions": totals,
        "instructions_per_submit": per_submit,
        "exp_over_base": {
            mode: round(per_submit[mode]["exp"] / per_submit[mode]["base"], 4) for mode in MODES
        },
        "seconds": round(time.monotonic() - started),
    }
    write_results(f"submit_instructions{tag}", data, out_dir=out_dir)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    parser.add_argument("--base-queries", type=Path, default=None, help="base's queries.sql")
    parser.add_argument("--queries", type=Path, default=None, help="exp's queries.sql")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--sql", default=None, help="SQL applied to exp's schema")
    what.add_argument("--sql-file", type=Path, default=None, help="a file of such SQL")
    parser.add_argument("--loops", default="30,130", help="two loop counts, fewer first")
    parser.add_argument("--pg-bin", type=Path, default=None, help="PostgreSQL's bin folder")
    parser.add_argument("--tag", default="", help="suffix of the results file")
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="results folder (default bench/results)"
    )
    args = parser.parse_args()
    few, many = (int(n) for n in args.loops.split(","))
    if not 0 < few < many:
        parser.error("--loops takes two counts, the fewer first")
    data = run(
        base_queries=args.base_queries,
        queries=args.queries,
        sql=args.sql_file.read_text() if args.sql_file else args.sql,
        loops=(few, many),
        pg_bin=args.pg_bin or embedded_bin(),
        tag=args.tag,
        out_dir=args.out_dir,
    )
    per_submit = data["instructions_per_submit"]
    print(data["postgres"])
    print_table(
        ["instructions per submit", "base", "exp", "exp / base"],
        [[mode, per_submit[mode]["base"], per_submit[mode]["exp"], data["exp_over_base"][mode]]
         for mode in MODES],
    )  # fmt: skip


if __name__ == "__main__":
    main()
