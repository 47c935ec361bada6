"""Queries read the rows they need, whatever the statistics say.

PostgreSQL plans from statistics taken at the last ANALYZE. Taken while
the runs were pending, they say almost nothing is leased; a fenced write
that also tested the status could then go through the partial index of
leased runs and read every leased run to find its one (measured: 12-15 ms
per event with 20,000 runs leased). The plans are checked here rather than
timed: a plan that reads thousands of rows to answer a few is the defect,
at any size.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import ClientCursor
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from runlane.database import create_pool
from runlane.lane_service import LaneService
from runlane.lane_store import LaneStore, RecoveryResult
from runlane.models import Outcome, RunStatus
from runlane.queries import named_queries
from runlane.service import RunService
from runlane.settings import Settings
from runlane.store import ClaimSpec, Finish, RunStore, listing_parts, listing_query

Conn = psycopg.Connection[Any]
LEASED = 2000


@pytest.fixture
async def leased(store: RunStore, sql: Conn) -> list[tuple[UUID, UUID]]:
    """LEASED runs claimed after an ANALYZE that saw them all pending."""
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts)"
        " SELECT 'a', '{}', 3 FROM generate_series(1, %s)",
        (LEASED,),
    )
    sql.execute("ANALYZE runlane.runs")
    runs = []
    while batch := await store.claim_batch(worker_id="w", limit=500, lease_seconds=300):
        runs += [(c.id, c.lease_token) for c in batch]
    assert len(runs) == LEASED
    return runs


def plan(sql: Conn, name: str, params: dict[str, Any], file_name: str = "queries.sql") -> str:
    text = ClientCursor(sql).mogrify(named_queries(file_name)[name], params)
    with sql.transaction(force_rollback=True):
        rows = sql.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + text).fetchall()
    return "\n".join(str(row[0]) for row in rows)


@pytest.mark.parametrize("name", ["append_event", "save_checkpoint", "count_turn", "record_effect"])
async def test_fenced_writes_find_the_run_by_primary_key(
    leased: list[tuple[UUID, UUID]], sql: Conn, name: str
) -> None:
    run_id, token = leased[LEASED // 2]
    params: dict[str, Any] = {
        "run_id": run_id,
        "lease_token": token,
        "kind": "note",
        "data": Jsonb({}),
        "checkpoint": Jsonb({}),
        "key": "k",
        "result": Jsonb(1),
    }
    # Each write runs inside a function (migration 0019), whose plans
    # EXPLAIN of the calling statement does not show: the indexes it
    # scanned and the rows it read say which plan it took.
    with sql.transaction(force_rollback=True):
        scans_before = index_scans(sql, "runs")
        rows_before = rows_read(sql, "runs")
        row = sql.execute(named_queries("queries.sql")[name], params).fetchone()
        assert row is not None and row[0] not in (None, False, 0), row
        scans_after = index_scans(sql, "runs")
        scanned = {name for name, n in scans_after.items() if n > scans_before[name]}
        assert scanned == {"runs_pkey"}, scanned
        assert rows_read(sql, "runs") - rows_before < 10


async def test_the_outcome_write_finds_the_run_by_primary_key(
    leased: list[tuple[UUID, UUID]], sql: Conn
) -> None:
    # The write runs inside runlane.finish_attempts, whose plan EXPLAIN of
    # the calling statement does not show: the indexes it scanned and the
    # rows it read say which plan it took.
    run_id, token = leased[LEASED // 2]
    params: dict[str, Any] = {
        "run_ids": [run_id],
        "lease_tokens": [token],
        "outcomes": ["completed"],
        "outputs": [None],
        "errors": [None],
        "retry_delays": [None],
        "interrupts": [None],
        "interrupt_expires": [None],
        "notify": False,
    }
    with sql.transaction(force_rollback=True):
        scans_before = index_scans(sql, "runs")
        rows_before = rows_read(sql, "runs")
        ended = sql.execute(named_queries("queries.sql")["finish_attempts"], params).fetchall()
        assert ended == [(run_id, "completed")]
        scans_after = index_scans(sql, "runs")
        scanned = {name for name, n in scans_after.items() if n > scans_before[name]}
        assert scanned == {"runs_pkey"}, scanned
        assert rows_read(sql, "runs") - rows_before < 10


async def test_an_ended_attempt_is_written_once_and_in_a_row_only_when_retried(
    leased: list[tuple[UUID, UUID]], sql: Conn
) -> None:
    # Migration 0035: the claim writes no attempt row (the leased run holds
    # the attempt in progress: its number, worker, token and start).
    # Migration 0050: the outcome write keeps a run's last attempt on the
    # run, and inserts a row whole only for an attempt that another will
    # follow (a retry), without reading run_attempts.
    ended = leased[:200]
    run_ids = [run_id for run_id, _ in ended]
    retried = set(run_ids[:50])
    held = {
        row[0]: row[1:]
        for row in sql.execute(
            "SELECT id, claim_count, worker_id, lease_token, attempt_started_at"
            " FROM runlane.runs WHERE id = ANY(%s)",
            (run_ids,),
        ).fetchall()
    }
    assert len(held) == len(ended)
    assert all(started is not None for *_, started in held.values())
    assert sql.execute(
        "SELECT count(*) FROM runlane.run_attempts WHERE run_id = ANY(%s)", (run_ids,)
    ).fetchone() == (0,)
    outcomes = ["retry" if run_id in retried else "completed" for run_id in run_ids]
    params: dict[str, Any] = {
        "run_ids": run_ids,
        "lease_tokens": [token for _, token in ended],
        "outcomes": outcomes,
        "outputs": [None] * len(ended),
        "errors": [None] * len(ended),
        "retry_delays": [None] * len(ended),
        "interrupts": [None] * len(ended),
        "interrupt_expires": [None] * len(ended),
        "notify": False,
    }
    with sql.transaction():
        scans_before = index_scans(sql, "run_attempts")
        rows_before = rows_read(sql, "run_attempts")
        finished = sql.execute(named_queries("queries.sql")["finish_attempts"], params).fetchall()
        assert len(finished) == len(ended)
        assert index_scans(sql, "run_attempts") == scans_before
        assert rows_read(sql, "run_attempts") == rows_before
    in_rows = {
        row[0]
        for row in sql.execute(
            "SELECT run_id FROM runlane.run_attempts WHERE run_id = ANY(%s)", (run_ids,)
        ).fetchall()
    }
    assert in_rows == retried
    attempts = sql.execute(
        "SELECT run_id, attempt, worker_id, lease_token, started_at, outcome, ended_at IS NOT NULL"
        " FROM runlane.attempts WHERE run_id = ANY(%s)",
        (run_ids,),
    ).fetchall()
    assert len(attempts) == len(run_ids)
    assert {row[0]: row[1:] for row in attempts} == {
        run_id: (*held[run_id], outcome, True)
        for run_id, outcome in zip(run_ids, outcomes, strict=True)
    }


async def test_a_heartbeat_checks_each_lease_by_primary_key(
    leased: list[tuple[UUID, UUID]], sql: Conn
) -> None:
    held = leased[:10]
    shown = plan(
        sql,
        "renew_leases",
        {
            "worker_id": "w",
            "hostname": "h",
            "pid": 1,
            "agents": ["a"],
            "concurrency": 10,
            "run_ids": [r for r, _ in held],
            "lease_tokens": [t for _, t in held],
            "lease_seconds": 300,
        },
    )
    assert "runs_leased_idx" not in shown, shown


async def test_reaping_one_lane_run_finds_it_by_primary_key(
    leased: list[tuple[UUID, UUID]], sql: Conn
) -> None:
    run_id, _ = leased[LEASED // 2]
    sql.execute(
        "UPDATE runlane.runs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
        (run_id,),
    )
    params = {"run_id": run_id, "limit": 1}
    with sql.transaction(force_rollback=True):
        reaped = sql.execute(named_queries("queries.sql")["reap_expired_leases"], params)
        assert [row[0] for row in reaped.fetchall()] == [run_id]
    shown = plan(sql, "reap_expired_leases", params)
    assert most_rows_touched(shown) < 100, shown


def most_rows_touched(shown: str) -> int:
    """The most rows any plan node returned or filtered out."""
    counts = [int(n) for n in re.findall(r"actual rows=(\d+)", shown)]
    counts += [int(n) for n in re.findall(r"Rows Removed by (?:Join )?Filter: (\d+)", shown)]
    return max(counts, default=0)


HISTORY = 3000


@pytest.fixture
def history(sql: Conn) -> None:
    """HISTORY runs completed a minute ago, analyzed."""
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, status, finished_at)"
        " SELECT 'a', '{}', 3, 'completed', now() - interval '1 minute'"
        " FROM generate_series(1, %s)",
        (HISTORY,),
    )
    sql.execute("ANALYZE runlane.runs")


async def test_queue_gauges_read_live_runs_only(history: None, sql: Conn) -> None:
    # The gauges run inside a function (migration 0024), whose plan EXPLAIN
    # does not show: the rows it reads are counted instead.
    sql.execute("INSERT INTO runlane.runs (agent, input, max_attempts) VALUES ('a', '{}', 3)")
    query = named_queries("queries.sql")["queue_gauges"]
    with sql.transaction(force_rollback=True):
        before = rows_read(sql, "runs")
        gauges = sql.execute(query, {"tenant": None}).fetchall()
        assert rows_read(sql, "runs") - before < 100
    assert [(g[0], g[3]) for g in gauges] == [("pending", 1)]


async def test_a_prune_pass_reads_only_the_runs_it_deletes(history: None, sql: Conn) -> None:
    sql.execute(
        "UPDATE runlane.runs SET finished_at = now() - interval '30 days'"
        " WHERE id IN (SELECT id FROM runlane.runs LIMIT 5)"
    )
    shown = plan(
        sql,
        "prune_runs",
        {
            "statuses": ["completed", "failed", "dead", "cancelled"],
            "older_than_seconds": [7 * 86400.0, 14 * 86400.0, 14 * 86400.0, 7 * 86400.0],
            "batch": 100,
        },
    )
    # The five due, deleted (PostgreSQL 18 prints rows as 5.00).
    assert re.search(r"Delete on runs r \(actual rows=5(\.0+)? ", shown), shown
    assert most_rows_touched(shown) < 100, shown


async def test_an_expired_interrupt_is_found_by_primary_key(history: None, sql: Conn) -> None:
    # Statistics saw no interrupted run; now thousands wait, all expired.
    sql.execute(
        "UPDATE runlane.runs SET status = 'interrupted',"
        " interrupt_expires_at = now() - interval '1 minute'"
    )
    row = sql.execute("SELECT id FROM runlane.runs LIMIT 1").fetchone()
    assert row is not None
    shown = plan(sql, "expire_interrupt", {"run_id": row[0]}, "lanes.sql")
    assert most_rows_touched(shown) < 100, shown


LANE_RUNS = 1000

PRUNE_ALL = {
    "statuses": ["completed", "failed", "dead", "cancelled"],
    "older_than_seconds": [7 * 86400.0] * 4,
    "batch": 500,
}


@pytest.fixture
def lane_history(history: None, sql: Conn) -> None:
    """Besides HISTORY direct runs: LANE_RUNS lane runs, each linked with
    its request both ways, finished 30 days ago, analyzed."""
    sql.execute(
        "INSERT INTO runlane.lanes (tenant, user_id, agent, thread_id)"
        " SELECT 'default', 'default', 'a', 't' || g FROM generate_series(1, 100) AS g"
    )
    sql.execute(
        """
        WITH first_lane AS (SELECT min(id) AS id FROM runlane.lanes), made AS (
            INSERT INTO runlane.runs (agent, input, max_attempts, status, finished_at,
                                      kind, lane_id)
            SELECT 'a', '{}', 3, 'completed', now() - interval '30 days', 'request',
                   first_lane.id + g %% 100
            FROM generate_series(1, %s) AS g, first_lane
            RETURNING id, lane_id, seq
        )
        INSERT INTO runlane.requests (request_id, tenant, lane_id, policy, status, input,
                                      max_attempts, request_order, run_id, dispatched_at)
        SELECT 'r' || seq, 'default', lane_id, 'enqueue', 'dispatched', '{}', 3, seq, id,
               now() - interval '30 days'
        FROM made
        """,
        (LANE_RUNS,),
    )
    sql.execute(
        "UPDATE runlane.runs AS r SET request_id = q.id"
        " FROM runlane.requests AS q WHERE q.run_id = r.id"
    )
    sql.execute("ANALYZE runlane.runs, runlane.requests")


def sequential_scans(sql: Conn, table: str) -> int:
    """Whole-table reads of runlane.<table> this session has not yet
    reported (PostgreSQL 15 reports at most once a second, never inside a
    transaction): compare two readings taken in one transaction."""
    row = sql.execute(
        "SELECT seq_scan FROM pg_stat_xact_user_tables"
        " WHERE schemaname = 'runlane' AND relname = %s",
        (table,),
    ).fetchone()
    assert row is not None
    return int(row[0])


async def test_pruning_runs_finds_their_requests_by_index(lane_history: None, sql: Conn) -> None:
    # Deleting a run sets its request's run_id to NULL (ON DELETE SET NULL):
    # one lookup per deleted run, which must not read the whole table.
    with sql.transaction(force_rollback=True):
        before = sequential_scans(sql, "requests")
        deleted = sql.execute(named_queries("queries.sql")["prune_runs"], PRUNE_ALL).fetchall()
        assert len(deleted) == 500
        assert sequential_scans(sql, "requests") == before
        row = sql.execute("SELECT count(*) FROM runlane.requests WHERE run_id IS NULL").fetchone()
        assert row == (500,)


async def test_pruning_runs_finds_their_attempts_and_listing_by_index(
    history: None, sql: Conn
) -> None:
    # A deleted run's attempts and listing row go with it in
    # runs_delete_dependents (migrations 0027, 0030, 0031): one DELETE of
    # each per statement, which must reach them through their primary keys
    # even with statistics taken while the tables were empty, not read
    # every attempt and listing row of the history.
    sql.execute("ANALYZE runlane.run_attempts, runlane.run_listing")
    sql.execute(
        "INSERT INTO runlane.run_attempts (run_id, attempt, worker_id, lease_token, ended_at,"
        " outcome) SELECT id, 1, 'w', gen_random_uuid(), now(), 'completed' FROM runlane.runs"
    )
    sql.execute(
        "UPDATE runlane.runs SET claim_count = 1,"
        " finished_at = CASE WHEN id IN (SELECT id FROM runlane.runs LIMIT 5)"
        " THEN now() - interval '30 days' ELSE finished_at END"
    )
    with sql.transaction(force_rollback=True):
        before = {t: table_reads_in_session(sql, t) for t in ("run_attempts", "run_listing")}
        deleted = [
            row[0] for row in sql.execute(named_queries("queries.sql")["prune_runs"], PRUNE_ALL)
        ]
        assert len(deleted) == 5
        for table, (scans_before, rows_before) in before.items():
            scans_after, rows_after = table_reads_in_session(sql, table)
            assert scans_after == scans_before, table
            assert rows_after - rows_before < 100, table
            left = sql.execute(
                f"SELECT count(*), count(*) FILTER (WHERE run_id = ANY(%s)) FROM runlane.{table}",
                (deleted,),
            ).fetchone()
            assert left == (HISTORY - 5, 0), table


async def test_pruning_requests_finds_their_runs_by_index(lane_history: None, sql: Conn) -> None:
    # A request whose run is gone is pruned; deleting it looks for runs
    # that still name it (runs.request_id, ON DELETE SET NULL).
    queries = named_queries("queries.sql")
    with sql.transaction(force_rollback=True):
        sql.execute(queries["prune_runs"], PRUNE_ALL)
        before = sequential_scans(sql, "runs")
        deleted = sql.execute(
            queries["prune_requests"], {"older_than_seconds": 7 * 86400.0, "batch": 500}
        ).fetchall()
        assert len(deleted) == 500
        assert sequential_scans(sql, "runs") == before


async def test_continuing_a_lane_finds_the_head_request_by_run(
    lane_history: None, sql: Conn
) -> None:
    row = sql.execute("SELECT run_id FROM runlane.requests LIMIT 1").fetchone()
    assert row is not None
    shown = plan(sql, "request_of_run", {"run_id": row[0]}, "lanes.sql")
    assert "requests_run_idx" in shown, shown


def table_counts(sql: Conn, table: str) -> tuple[int, int]:
    """Rows of runlane.<table> read by any scan, and its HOT updates, not
    yet reported (as sequential_scans: compare two readings in one
    transaction)."""
    row = sql.execute(
        "SELECT seq_tup_read + idx_tup_fetch, n_tup_hot_upd FROM pg_stat_xact_user_tables"
        " WHERE schemaname = 'runlane' AND relname = %s",
        (table,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def rows_read(sql: Conn, table: str) -> int:
    return table_counts(sql, table)[0]


def listing_reads(sql: Conn) -> tuple[int, int]:
    """Rows of runs, and rows and index entries of run_listing, read and
    not yet reported (as sequential_scans)."""
    # A listing reads run_listing's entries mostly from its indexes alone
    # (index-only scans), which idx_tup_fetch does not count.
    row = sql.execute(
        "SELECT t.seq_tup_read + coalesce(sum(pg_stat_get_xact_tuples_returned(i.indexrelid)), 0)"
        " FROM pg_stat_xact_user_tables AS t JOIN pg_index AS i ON i.indrelid = t.relid"
        " WHERE t.relid = 'runlane.run_listing'::regclass GROUP BY t.seq_tup_read"
    ).fetchone()
    assert row is not None
    return rows_read(sql, "runs"), int(row[0])


def most_read(before: tuple[int, int], after: tuple[int, int]) -> int:
    """The most rows a listing read from one of runs and run_listing."""
    return max(a - b for a, b in zip(after, before, strict=True))


def newest_first(sql: Conn, statuses: list[str] | None) -> list[UUID]:
    """Every run of these statuses (any when None), as a listing of every
    tenant orders them."""
    return [
        row[0]
        for row in sql.execute(
            "SELECT id FROM runlane.runs WHERE %s::text[] IS NULL OR status = ANY(%s)"
            " ORDER BY created_at DESC, id DESC",
            (statuses, statuses),
        ).fetchall()
    ]


def read_page(
    sql: Conn, query: str, params: dict[str, Any], *, prepare: bool = False
) -> tuple[list[dict[str, Any]], int, set[str]]:
    """A page of a listing, its rows by column name; the most rows it read
    from one of runs and run_listing; and the indexes of runs it scanned."""
    with sql.transaction(force_rollback=True):
        before, scans = listing_reads(sql), index_scans(sql, "runs")
        cur = sql.execute(query, params, prepare=prepare)
        rows = cur.fetchall()
        read = most_read(before, listing_reads(sql))
        scanned = {name for name, n in index_scans(sql, "runs").items() if n > scans[name]}
    columns = [c.name for c in cur.description or []]
    return [dict(zip(columns, row, strict=True)) for row in rows], read, scanned


def list_pages(
    sql: Conn, query: str, params: dict[str, Any], pages: int
) -> tuple[list[UUID], list[int]]:
    """The runs of the first ``pages`` pages of a listing, each page asked
    with the cursor of the one before, and the most rows each page read
    from one of runs and run_listing."""
    ids: list[UUID] = []
    reads: list[int] = []
    for _ in range(pages):
        page, read, _ = read_page(sql, query, params)
        reads.append(read)
        ids += [row["id"] for row in page]
        params = {
            **params,
            "before_created_at": page[-1]["created_at"],
            "before_id": page[-1]["id"],
        }
    return ids, reads


def index_scans(sql: Conn, table: str) -> dict[str, int]:
    """Scans of each index of runlane.<table> not yet reported (as
    sequential_scans)."""
    rows = sql.execute(
        "SELECT c.relname, pg_stat_get_xact_numscans(c.oid) FROM pg_index AS i"
        " JOIN pg_class AS c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = ('runlane.' || %s)::regclass",
        (table,),
    ).fetchall()
    return {str(name): int(scans) for name, scans in rows}


CLAIM_INDEXES = {
    "runs_pkey",
    "runs_claim_idx",
    "runs_claim_by_agent_idx",
    "runs_pending_age_idx",
    "runs_pending_age_by_agent_idx",
}


AGE_INDEXES = ("runs_pending_age_idx", "runs_pending_age_by_agent_idx")


def claim_params(agents: list[str] | None, limit: int) -> dict[str, Any]:
    """claim_batch's parameters for worker w."""
    spec = ClaimSpec(worker_id="w", limit=limit, lease_seconds=30.0, agents=agents)
    return {**spec.params(), "aging_seconds": 60.0}


def add_pending_runs(sql: Conn, n: int) -> None:
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, priority)"
        " SELECT 'a', '{}', 3, g %% 3 FROM generate_series(1, %s) AS g",
        (n,),
    )


def cap_the_tenant(sql: Conn) -> None:
    """A cap the runs' tenant never reaches: from now on every claim is the
    capped claim (runlane.claim_capped_runs)."""
    sql.execute("INSERT INTO runlane.tenant_limits (tenant, max_running) VALUES ('default', 10000)")


@pytest.mark.parametrize("capped", [False, True], ids=["uncapped", "capped"])
@pytest.mark.parametrize("agents", [["a"], None], ids=["by-agent", "any-agent"])
async def test_a_claim_planned_on_an_empty_queue_reads_only_what_it_claims(
    sql: Conn, agents: list[str] | None, capped: bool
) -> None:
    # The claim keeps its plans for the session: the first ones are made
    # here, on a table analyzed empty, where a sequential scan and a sort
    # look cheapest. Then a backlog arrives, unseen by the statistics. The
    # capped claim keeps its plans too (migration 0045).
    if capped:
        cap_the_tenant(sql)
    claim = named_queries("queries.sql")["claim_batch"]
    params = claim_params(agents, 5)
    sql.execute("ANALYZE runlane.runs")
    for _ in range(6):
        assert sql.execute(claim, params).fetchall() == []
    add_pending_runs(sql, 3000)
    with sql.transaction(force_rollback=True):
        before = rows_read(sql, "runs")
        claimed = sql.execute(claim, params).fetchall()
        assert len(claimed) == 5
        assert rows_read(sql, "runs") - before < 100


@pytest.mark.parametrize("capped", [False, True], ids=["uncapped", "capped"])
@pytest.mark.parametrize("agents", [["a"], None], ids=["by-agent", "any-agent"])
async def test_a_claim_planned_on_one_run_reads_only_claim_indexes(
    sql: Conn, agents: list[str] | None, capped: bool
) -> None:
    # The claim's plans are made at its first claim, here of the only run
    # in a table emptied since its statistics were taken, where every index
    # holding `id` looked as cheap as the primary key (the plan 0012 kept in
    # the wake-up benchmark read runs_owner_listing_idx whole); they are
    # kept when the table has grown. The capped claim counts the tenant's
    # running runs through the index of leased runs as well.
    if capped:
        cap_the_tenant(sql)
    claim = named_queries("queries.sql")["claim_batch"]
    params = claim_params(agents, 10)
    add_pending_runs(sql, 3000)
    sql.execute("ANALYZE runlane.runs")
    sql.execute("TRUNCATE runlane.runs CASCADE")
    add_pending_runs(sql, 1)
    assert len(sql.execute(claim, params).fetchall()) == 1
    add_pending_runs(sql, 3000)
    with sql.transaction(force_rollback=True):
        scans_before = index_scans(sql, "runs")
        rows_before = rows_read(sql, "runs")
        assert len(sql.execute(claim, params).fetchall()) == 10
        scans_after = index_scans(sql, "runs")
        scanned = {name for name, n in scans_after.items() if n > scans_before[name]}
        counted = {"runs_leased_idx"} if capped else set()
        assert scanned <= CLAIM_INDEXES | counted, scanned
        assert rows_read(sql, "runs") - rows_before < 100


@pytest.mark.parametrize("agents", [["a"], None], ids=["by-agent", "any-agent"])
async def test_a_claim_looks_at_one_entry_for_the_age_of_a_young_backlog(
    sql: Conn, agents: list[str] | None
) -> None:
    # With aging on, the claim first looks at the oldest available run to
    # see whether any has waited a whole period (migration 0034): one entry
    # of an age index, however many runs wait. A look that tested the age
    # in the index's condition read every entry of the agent (the agent is
    # a range there, not an equality), 0.9 ms among 20,000 runs.
    claim = named_queries("queries.sql")["claim_batch"]
    params = claim_params(agents, 10)
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, created_at)"
        " SELECT 'a', '{}', 3, clock_timestamp() FROM generate_series(1, 6000)"
    )
    sql.execute("ANALYZE runlane.runs")
    assert len(sql.execute(claim, params).fetchall()) == 10
    with sql.transaction(force_rollback=True):
        before = index_pages_read(sql, AGE_INDEXES)
        assert len(sql.execute(claim, params).fetchall()) == 10
        assert index_pages_read(sql, AGE_INDEXES) - before <= 4


def index_pages_read(sql: Conn, indexes: tuple[str, ...]) -> int:
    """Pages of these indexes of runlane.runs read (from shared buffers or
    not) and not yet reported (as sequential_scans)."""
    row = sql.execute(
        "SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid)) FROM pg_class AS c"
        " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'runlane' AND c.relname = ANY(%s)",
        (list(indexes),),
    ).fetchone()
    assert row is not None
    return int(row[0])


def table_reads_in_session(sql: Conn, table: str) -> tuple[int, int]:
    """Sequential scans of runlane.<table> and rows read so far, reported
    or not (one statement, so that a report in between cannot count twice
    or not at all); for reads that happen at commit, which
    sequential_scans and rows_read cannot see."""
    row = sql.execute(
        "SELECT t.seq_scan + x.seq_scan, t.seq_tup_read + coalesce(t.idx_tup_fetch, 0)"
        " + x.seq_tup_read + coalesce(x.idx_tup_fetch, 0)"
        " FROM pg_stat_user_tables AS t JOIN pg_stat_xact_user_tables AS x USING (relid)"
        " WHERE t.schemaname = 'runlane' AND t.relname = %s",
        (table,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@contextmanager
def reads_without_a_scan(sql: Conn, table: str, *, fewer_than: int) -> Iterator[None]:
    """What the block does reads runlane.<table> without a sequential scan
    and reads fewer than ``fewer_than`` of its rows, at commit included
    (table_reads_in_session)."""
    scans_before, rows_before = table_reads_in_session(sql, table)
    yield
    scans_after, rows_after = table_reads_in_session(sql, table)
    assert scans_after == scans_before
    assert rows_after - rows_before < fewer_than


@pytest.mark.parametrize("capped", [False, True], ids=["uncapped", "capped"])
async def test_a_claims_attempt_rows_cost_no_read_of_runs(sql: Conn, capped: bool) -> None:
    # Until migration 0027 each claimed run's attempt row had a foreign key
    # to it, checked with one lookup of runs under a plan kept for the
    # session: made on a table analyzed with 20 runs, where reading the
    # table costs less than the index, that plan read runs up to the run's
    # new row version after the table had grown (3 ms per claimed run). The
    # key is gone; whatever replaces it must not bring such a read back.
    # With a tenant cap in place the capped claim runs, without one the
    # uncapped claim.
    if capped:
        cap_the_tenant(sql)
    claim = named_queries("queries.sql")["claim_batch"]
    params = claim_params(None, 1)
    add_pending_runs(sql, 20)
    sql.execute("ANALYZE runlane.runs")
    for _ in range(12):
        assert len(sql.execute(claim, params).fetchall()) == 1
    add_pending_runs(sql, 3000)
    with reads_without_a_scan(sql, "runs", fewer_than=300):
        for _ in range(3):
            assert len(sql.execute(claim, params).fetchall()) == 1
    running = sql.execute("SELECT count(*) FROM runlane.runs WHERE status = 'running'").fetchone()
    assert running == (15,)


def finish_a_burst_analyzed_while_leased(sql: Conn) -> None:
    """3,000 runs claimed, analyzed while leased, then finished: statistics
    that say most runs are leased, about a table where none is."""
    add_pending_runs(sql, 3000)
    claim = named_queries("queries.sql")["claim_batch"]
    assert len(sql.execute(claim, claim_params(None, 3000)).fetchall()) == 3000
    sql.execute("ANALYZE runlane.runs")
    sql.execute(
        "UPDATE runlane.runs SET status = 'completed', lease_token = NULL,"
        " lease_expires_at = NULL, finished_at = now()"
    )


async def test_a_capped_claim_counts_a_tenants_running_runs_after_a_burst(sql: Conn) -> None:
    # A capped claim counts each capped tenant's running runs, planned on
    # every call from the statistics at hand. Taken during a burst, they say
    # most runs are running; once those runs have finished, a count that
    # trusted them read the whole table for each capped tenant (0038).
    cap_the_tenant(sql)
    claim = named_queries("queries.sql")["claim_batch"]
    finish_a_burst_analyzed_while_leased(sql)
    add_pending_runs(sql, 20)
    with reads_without_a_scan(sql, "runs", fewer_than=300):
        for _ in range(3):
            assert len(sql.execute(claim, claim_params(None, 1)).fetchall()) == 1


async def test_the_tenant_caps_count_running_runs_after_a_burst(sql: Conn) -> None:
    # The caps' listing (runlane tenants list, runlane status) counts each
    # capped tenant's running runs: after a burst analyzed while most runs
    # were running, a count planned from those statistics read the table
    # (migration 0039).
    for tenant in ("default", "t2"):
        sql.execute(
            "INSERT INTO runlane.tenant_limits (tenant, max_running) VALUES (%s, 10000)", (tenant,)
        )
    claim = named_queries("queries.sql")["claim_batch"]
    finish_a_burst_analyzed_while_leased(sql)
    add_pending_runs(sql, 20)
    assert len(sql.execute(claim, claim_params(None, 2)).fetchall()) == 2
    query = named_queries("queries.sql")["list_tenant_limits"]
    with reads_without_a_scan(sql, "runs", fewer_than=300):
        for tenant in (None, "default"):
            caps = sql.execute(query, {"tenant": tenant}).fetchall()
            assert caps[0][0] == "default" and caps[0][2] == 2


def test_the_dead_count_after_a_burst_of_dead_runs_reads_no_table(sql: Conn) -> None:
    # Workers' metrics and the dashboard's overview count the dead runs
    # every few seconds on long-lived connections. After a burst sent to
    # the dead letter (analyzed there), then re-queued and finished, a count
    # planned from those statistics read the whole table at every poll
    # (migration 0040).
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, status, attempts, finished_at)"
        " SELECT 'a', '{}', 3, 'dead', 3, now() FROM generate_series(1, 3000)"
    )
    sql.execute("ANALYZE runlane.runs")
    sql.execute("UPDATE runlane.runs SET status = 'completed'")
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, status, attempts, finished_at)"
        " SELECT 'a', '{}', 3, 'dead', 3, now() FROM generate_series(1, 2)"
    )
    query = named_queries("queries.sql")["dead_count"]
    with reads_without_a_scan(sql, "runs", fewer_than=100):
        for tenant in (None, "default", "other"):
            for _ in range(7):  # prepared, as on a long-lived connection
                count = sql.execute(query, {"tenant": tenant}, prepare=True).fetchone()
                assert count == (0 if tenant == "other" else 2,)


def test_the_reapers_search_after_a_burst_reads_the_leased_runs_only(sql: Conn) -> None:
    # The reaper's pass, prepared on its long-lived connection, every 10 s:
    # after a burst analyzed while most runs were leased, a search for
    # expired leases planned from those statistics read the whole table at
    # every pass (migration 0041).
    claim = named_queries("queries.sql")["claim_batch"]
    finish_a_burst_analyzed_while_leased(sql)
    add_pending_runs(sql, 2)
    assert len(sql.execute(claim, {**claim_params(None, 2), "lease_seconds": 0.0}).fetchall()) == 2
    reap = named_queries("queries.sql")["reap_expired_leases"]
    with reads_without_a_scan(sql, "runs", fewer_than=100):
        reaped = sql.execute(reap, {"run_id": None, "limit": 100}, prepare=True).fetchall()
        assert sorted(row[1] for row in reaped) == ["pending", "pending"]
        for _ in range(6):
            assert sql.execute(reap, {"run_id": None, "limit": 100}, prepare=True).fetchall() == []


def test_the_workers_list_after_a_burst_reads_the_leased_runs_only(sql: Conn) -> None:
    # runlane workers, runlane status and the dashboard's overview list
    # each worker's leased runs. After a burst analyzed while most runs
    # were leased by one worker, that search read the whole table for every
    # worker listed (7 listings of two workers: 42,028 rows in 14 scans;
    # migration 0043).
    sql.execute(
        "INSERT INTO runlane.workers (id, hostname, pid, agents, concurrency, running)"
        " VALUES ('w', 'h', 1, '{a}', 10, 2), ('idle', 'h', 2, '{a}', 10, 0)"
    )
    claim = named_queries("queries.sql")["claim_batch"]
    finish_a_burst_analyzed_while_leased(sql)
    add_pending_runs(sql, 2)
    claimed = {row[0] for row in sql.execute(claim, claim_params(None, 2)).fetchall()}
    query = named_queries("queries.sql")["list_workers"]
    params = {"alive_seconds": 30.0, "forget_seconds": 3600.0}
    with reads_without_a_scan(sql, "runs", fewer_than=100):
        for _ in range(7):  # prepared, as on a long-lived connection
            workers = sql.execute(query, params, prepare=True).fetchall()
            held = {str(row[0]): row[-1] for row in workers}
            assert set(held["w"]) == claimed and held["idle"] == []


def test_a_prune_pass_after_a_burst_of_ended_requests_reads_only_those_due(sql: Conn) -> None:
    # The pruner looks for ended requests at every pass. After a burst of
    # rejected requests was analyzed, that search read the whole requests
    # table, which keeps every dispatched request as long as its run (7
    # passes: 24,006 rows in 10 scans; migration 0043).
    sql.execute(
        "INSERT INTO runlane.lanes (tenant, user_id, agent, thread_id)"
        " VALUES ('default', 'u', 'a', 't')"
    )
    insert = (
        "INSERT INTO runlane.requests (lane_id, tenant, request_id, policy, status, ended_at,"
        " input, max_attempts, request_order)"
        " SELECT (SELECT id FROM runlane.lanes), 'default', %s || g, 'reject', 'rejected',"
        " now() - %s::interval, '{}', 3, g FROM generate_series(1, %s) AS g"
    )
    sql.execute(insert, ("burst-", "30 days", 3000))
    sql.execute("ANALYZE runlane.requests")
    # Those requests queued again (no longer ended), two rejections past the
    # retention and two within it.
    sql.execute("UPDATE runlane.requests SET status = 'queued', ended_at = NULL")
    sql.execute(insert, ("due-", "30 days", 2))
    sql.execute(insert, ("kept-", "1 day", 2))
    query = named_queries("queries.sql")["prune_requests"]
    params = {"older_than_seconds": 7 * 86400.0, "batch": 500}
    with reads_without_a_scan(sql, "requests", fewer_than=100):
        deleted = sql.execute(query, params, prepare=True).fetchall()
        assert len(deleted) == 2
        for _ in range(6):
            assert sql.execute(query, params, prepare=True).fetchall() == []
    left = sql.execute("SELECT status, count(*) FROM runlane.requests GROUP BY 1 ORDER BY 1")
    assert left.fetchall() == [("queued", 3000), ("rejected", 2)]


async def pool_rows_read(pool: AsyncConnectionPool[Any], tables: tuple[str, ...]) -> int:
    """Rows of the runlane tables read on a one-connection pool's
    connection, reported and not yet reported, in one statement."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT sum(t.seq_tup_read + coalesce(t.idx_tup_fetch, 0)"
            " + x.seq_tup_read + coalesce(x.idx_tup_fetch, 0)) AS n"
            " FROM pg_stat_user_tables AS t JOIN pg_stat_xact_user_tables AS x"
            " USING (relid) WHERE t.schemaname = 'runlane' AND t.relname = ANY(%s)",
            (list(tables),),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def test_a_long_lived_worker_connection_plans_for_the_table_as_it_is(
    db_url: str, sql: Conn
) -> None:
    # One pool connection, as a worker's: its finish statement runs often
    # enough on a small table to be prepared, and PostgreSQL would keep a
    # plan that joins the batch to runs by reading the whole table.
    pool = create_pool(db_url, min_size=1, max_size=1, check=False)
    await pool.open()
    try:
        store = RunStore(pool)

        async def claim_and_finish_one() -> None:
            claimed = await store.claim_batch(worker_id="w", limit=1, lease_seconds=30)
            assert len(claimed) == 1
            await store.finish_attempts_status(
                [Finish(claimed[0].id, claimed[0].lease_token, Outcome.COMPLETED)]
            )

        for _ in range(12):
            sql.execute(
                "INSERT INTO runlane.runs (agent, input, max_attempts) VALUES ('a', '{}', 3)"
            )
            await claim_and_finish_one()
        sql.execute(
            "INSERT INTO runlane.runs (agent, input, max_attempts, status, finished_at)"
            " SELECT 'a', '{}', 3, 'completed', now() FROM generate_series(1, 3000)"
        )
        sql.execute("INSERT INTO runlane.runs (agent, input, max_attempts) VALUES ('a', '{}', 3)")
        claimed = await store.claim_batch(worker_id="w", limit=1, lease_seconds=30)
        before = await pool_rows_read(pool, ("runs",))
        statuses = await store.finish_attempts_status(
            [Finish(claimed[0].id, claimed[0].lease_token, Outcome.COMPLETED)]
        )
        assert statuses == {claimed[0].id: RunStatus.COMPLETED}
        assert await pool_rows_read(pool, ("runs",)) - before < 100
    finally:
        await pool.close()


async def test_a_long_lived_worker_connections_run_writes_keep_index_plans(
    db_url: str, sql: Conn
) -> None:
    # The writes a running attempt makes (events, checkpoints, turns,
    # effects) are prepared once they have run five times on a connection,
    # and PostgreSQL then keeps one plan for each, and for the foreign-key
    # checks of the rows they insert. Made on a table of a page, where
    # reading it whole is cheapest, such a plan kept reading whole tables as
    # they grew (30,000 rows per event appended).
    pool = create_pool(db_url, min_size=1, max_size=1, check=False)
    await pool.open()
    try:
        store = RunStore(pool)

        async def each_write(run_id: UUID, token: UUID, i: int) -> None:
            assert await store.append_event(run_id, token, "note", {"i": i}) is not None
            assert await store.save_checkpoint(run_id, token, {"i": i})
            assert await store.count_turn(run_id, token) == i + 1
            assert await store.record_effect(run_id, token, f"k{i}", i) == (True, i)
            assert await store.get_effect(run_id, f"k{i}") == (True, i)

        add_pending_runs(sql, 3)
        sql.execute("ANALYZE runlane.runs")
        claimed = await store.claim_batch(worker_id="w", limit=1, lease_seconds=300)
        run_id, token = claimed[0].id, claimed[0].lease_token
        # psycopg prepares a statement at its sixth run; PostgreSQL tries
        # its kept (generic) plan from the prepared statement's sixth run.
        for i in range(12):
            await each_write(run_id, token, i)
        sql.execute(
            "INSERT INTO runlane.runs (agent, input, max_attempts, status, finished_at)"
            " SELECT 'a', '{}', 3, 'completed', now() FROM generate_series(1, 5000)"
        )
        sql.execute(
            "INSERT INTO runlane.run_effects (run_id, key, result, attempt)"
            " SELECT id, 'x', '1', 1 FROM runlane.runs WHERE status = 'completed'"
        )
        before = await pool_rows_read(pool, ("runs", "run_effects"))
        await each_write(run_id, token, 12)
        assert await pool_rows_read(pool, ("runs", "run_effects")) - before < 100
    finally:
        await pool.close()


@pytest.mark.parametrize("capped", [False, True], ids=["uncapped", "capped"])
async def test_a_claim_for_one_agent_reads_only_that_agents_runs(sql: Conn, capped: bool) -> None:
    # Statistics taken when other agents' runs had finished and nothing was
    # pending; then another agent's backlog arrives, with five runs of this
    # worker's agent behind it. With a tenant cap in place the capped claim
    # runs (migration 0020), without one the uncapped claim (0014).
    if capped:
        cap_the_tenant(sql)
    claim = named_queries("queries.sql")["claim_batch"]
    params = claim_params(["a"], 5)
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, status, finished_at)"
        " SELECT 'x' || g %% 10, '{}', 3, 'completed', now() FROM generate_series(1, %s) AS g",
        (1000,),
    )
    sql.execute("ANALYZE runlane.runs")
    for _ in range(6):
        assert sql.execute(claim, params).fetchall() == []
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts)"
        " SELECT 'other', '{}', 3 FROM generate_series(1, 3000)"
    )
    add_pending_runs(sql, 5)
    with sql.transaction(force_rollback=True):
        before = rows_read(sql, "runs")
        claimed = sql.execute(claim, params).fetchall()
        assert [row[1] for row in claimed] == ["a"] * 5  # agent
        assert rows_read(sql, "runs") - before < 100


def list_params(statuses: list[str], user_id: str | None) -> dict[str, Any]:
    """list_runs' parameters: the first page of 5, newest first."""
    return {
        "tenant": "default",
        "user_id": user_id,
        "thread_id": None,
        "statuses": statuses,
        "agent": None,
        "before_created_at": None,
        "before_id": None,
        "limit": 5,
    }


@pytest.mark.parametrize("user_id", [None, "u"], ids=["tenant", "owner"])
@pytest.mark.parametrize("status", ["failed", "dead", "cancelled", "interrupted"])
async def test_listing_runs_of_a_rare_status_reads_only_those_runs(
    sql: Conn, status: str, user_id: str | None
) -> None:
    # A tenant's history: 5,000 completed runs, one in 500 of another
    # status, the newest of those 1,000 runs back. Without an index of its
    # own, a page of them walked the history (migration 0021).
    sql.execute(
        "INSERT INTO runlane.runs (agent, user_id, input, max_attempts, status, finished_at,"
        " created_at)"
        " SELECT 'a', 'u', '{}', 3, CASE WHEN g %% 500 = 0 THEN %s ELSE 'completed' END,"
        " now(), now() - g * interval '1 second' FROM generate_series(1, 5000) AS g",
        (status,),
    )
    sql.execute("ANALYZE runlane.runs, runlane.run_listing")
    query = named_queries("queries.sql")[
        listing_query([RunStatus(status)], tenant="default", user_id=user_id)
    ]
    with sql.transaction(force_rollback=True):
        before = listing_reads(sql)
        listed = sql.execute(query, list_params([status], user_id)).fetchall()
        read = most_read(before, listing_reads(sql))
    expected = sql.execute(
        "SELECT id FROM runlane.runs WHERE status = %s ORDER BY created_at DESC LIMIT 5",
        (status,),
    ).fetchall()
    assert [row[0] for row in listed] == [row[0] for row in expected]
    assert len(listed) == 5
    assert read < 100


async def test_an_owners_listing_reads_a_page_not_the_owners_history(sql: Conn) -> None:
    # An owner's page is read through run_listing_owner_idx and each run
    # fetched by id (migration 0030). Planned from clauses the planner
    # counted as independent (the hash-led indexes of 0029 without their
    # statistics), the page was a read and sort of all the owner's runs.
    # 30 tenants of 5 owners, 200 runs each.
    sql.execute(
        "INSERT INTO runlane.runs (tenant, user_id, agent, input, max_attempts, status,"
        " finished_at, created_at)"
        " SELECT 't' || (g % 30), 'u' || (g / 30 % 5), 'a', '{}', 3, 'completed', now(),"
        " now() - g * interval '1 second' FROM generate_series(1, 30000) AS g"
    )
    sql.execute("ANALYZE runlane.runs, runlane.run_listing")
    query = named_queries("queries.sql")["list_runs"]
    params = {**list_params([], "u3"), "tenant": "t1", "statuses": None, "limit": 50}
    with sql.transaction(force_rollback=True):
        before = listing_reads(sql)
        listed = sql.execute(query, params).fetchall()
        read = most_read(before, listing_reads(sql))
    expected = sql.execute(
        "SELECT id FROM runlane.runs WHERE tenant = 't1' AND user_id = 'u3'"
        " ORDER BY created_at DESC, id DESC LIMIT 50"
    ).fetchall()
    assert [row[0] for row in listed] == [row[0] for row in expected]
    assert read < 100


def add_three_tenants_history(sql: Conn) -> None:
    """6,000 completed runs of tenants t0, t1 and t2, interleaved in time,
    one a second back from now."""
    sql.execute(
        "INSERT INTO runlane.runs (tenant, agent, input, max_attempts, status, finished_at,"
        " created_at)"
        " SELECT 't' || (g % 3), 'a', '{}', 3, 'completed', now(),"
        " now() - g * interval '1 second' FROM generate_series(1, 6000) AS g"
    )


@pytest.mark.parametrize("statuses", [None, ["completed"], ["pending"], ["failed"]], ids=str)
async def test_listing_runs_of_every_tenant_reads_a_page_not_the_history(
    sql: Conn, statuses: list[str] | None
) -> None:
    # An operator's listing (`runlane runs list`: no tenant) read and sorted
    # every run stored to show one page. Three tenants' histories, their
    # runs interleaved in time, and a few pending runs among the oldest.
    add_three_tenants_history(sql)
    sql.execute(
        "INSERT INTO runlane.runs (tenant, agent, input, max_attempts, created_at)"
        " SELECT 't' || (g % 3), 'a', '{}', 3, now() - interval '1 day'"
        " FROM generate_series(1, 7) AS g"
    )
    sql.execute(
        "INSERT INTO runlane.runs (tenant, agent, input, max_attempts, status, finished_at,"
        " created_at)"
        " SELECT 't' || (g % 3), 'a', '{}', 3, 'failed', now(), now() - interval '2 days'"
        " FROM generate_series(1, 7) AS g"
    )
    sql.execute("ANALYZE runlane.runs, runlane.run_listing")
    query = named_queries("queries.sql")[
        listing_query([RunStatus(s) for s in statuses] if statuses else None)
    ]
    params = {**list_params(statuses or [], None), "tenant": None, "statuses": statuses}
    expected = newest_first(sql, statuses)
    pages, reads = list_pages(sql, query, params, 2)
    assert max(reads) < 100, reads
    assert pages == expected[:10]


@pytest.mark.parametrize(
    "statuses",
    [
        ["pending", "running"],
        ["pending", "running", "cancel_requested"],
        ["pending", "failed"],
        ["running", "dead", "failed"],
    ],
    ids=str,
)
@pytest.mark.parametrize("tenant", [None, "t1"])
async def test_listing_live_runs_with_others_reads_their_indexes_not_the_history(
    sql: Conn, statuses: list[str], tenant: str | None
) -> None:
    # An operator's question "what is waiting or running?" asked of one
    # walk read every run of each tenant to find the few live ones: no index
    # holds both kinds. RunStore lists such a set one part per index
    # (listing_parts); each part reads a page (with a tenant, after a walk
    # of the tenant's newest 10 pages' worth), and the one walk would not.
    add_three_tenants_history(sql)
    sql.execute(
        "INSERT INTO runlane.runs (tenant, agent, input, max_attempts, status, lease_token,"
        " lease_expires_at, worker_id, finished_at, created_at)"
        " SELECT 't' || (g % 3), 'a', '{}', 3, s, CASE WHEN s = 'running'"
        " THEN gen_random_uuid() END, now() + interval '1 hour', 'w',"
        " CASE WHEN s IN ('failed', 'dead') THEN now() END, now() - interval '1 day'"
        " FROM generate_series(1, 6) AS g, unnest('{pending,running,failed,dead}'::text[]) AS s"
    )
    sql.execute("ANALYZE runlane.runs, runlane.run_listing")
    params = {**list_params(statuses, None), "tenant": tenant}
    for part in listing_parts([RunStatus(s) for s in statuses]):
        assert part is not None
        with sql.transaction(force_rollback=True):
            before = listing_reads(sql)
            rows = sql.execute(
                named_queries("queries.sql")[listing_query(part, tenant=tenant)],
                {**params, "statuses": [str(s) for s in part]},
            ).fetchall()
            read = most_read(before, listing_reads(sql))
        assert rows and read < 100, (part, read)
    with sql.transaction(force_rollback=True):
        before = listing_reads(sql)
        sql.execute(named_queries("queries.sql")["list_runs"], params).fetchall()
        assert most_read(before, listing_reads(sql)) >= 2000


@pytest.mark.parametrize(
    "statuses", [["pending"], ["running"], ["pending", "running", "cancel_requested"]], ids=str
)
@pytest.mark.parametrize("tenant", [None, "default"])
async def test_listing_live_runs_after_a_burst_reads_the_live_runs_only(
    sql: Conn, store: RunStore, statuses: list[str], tenant: str | None
) -> None:
    # Statistics taken during a burst say pending runs are common; when the
    # queue has drained they still say so until the next ANALYZE, and a
    # listing that trusted them walked the whole history for the few runs
    # still live (migration 0037). Kept plans too: each listing runs enough
    # times here to be prepared.
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, created_at)"
        " SELECT 'a', '{}', 3, now() - g * interval '1 second' FROM generate_series(1, 3000) AS g"
    )
    sql.execute("ANALYZE runlane.runs, runlane.run_listing")
    sql.execute("UPDATE runlane.runs SET status = 'completed', attempts = 1, finished_at = now()")
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, created_at)"
        " SELECT 'a', '{}', 3, now() - interval '1 day' FROM generate_series(1, 3)"
    )
    claimed = await store.claim_batch(worker_id="w", limit=1, lease_seconds=300)
    assert len(claimed) == 1
    wanted = [RunStatus(s) for s in statuses]
    query = named_queries("queries.sql")[listing_query(wanted, tenant=tenant)]
    params = {**list_params(statuses, None), "tenant": tenant}
    live = sql.execute(
        "SELECT count(*) FROM runlane.runs WHERE status = ANY(%s)", (statuses,)
    ).fetchone()
    for _ in range(7):
        with sql.transaction(force_rollback=True):
            before = listing_reads(sql)
            page = sql.execute(query, params, prepare=True).fetchall()
            read = most_read(before, listing_reads(sql))
        assert (len(page),) == live  # a page of 5 holds them all
        assert read < 100, read
    if "pending" in statuses:
        # The walk trusted the statistics and read the history.
        with sql.transaction(force_rollback=True):
            before = listing_reads(sql)
            sql.execute(named_queries("queries.sql")["list_runs"], params).fetchall()
            assert most_read(before, listing_reads(sql)) >= 3000


@pytest.mark.parametrize("backlog_of", ["default", "other"])
async def test_a_tenants_live_listing_behind_a_backlog_reads_a_page(
    sql: Conn, backlog_of: str
) -> None:
    # Read through the partial indexes alone, a tenant's live runs cost
    # every pending run of every tenant. The walk of the tenant's newest
    # runs comes first: its own backlog fills the page at the top, and a
    # tenant with few runs is walked to its end.
    sql.execute(
        "INSERT INTO runlane.runs (tenant, agent, input, max_attempts, created_at)"
        " SELECT %s, 'a', '{}', 3, now() - g * interval '1 ms'"
        " FROM generate_series(1, 3000) AS g",
        (backlog_of,),
    )
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, status, finished_at, created_at)"
        " SELECT 'a', '{}', 3, s, CASE WHEN s <> 'pending' THEN now() END,"
        " now() - interval '1 day'"
        " FROM unnest('{pending,completed,completed}'::text[]) AS s"
    )
    sql.execute("ANALYZE runlane.runs, runlane.run_listing")
    params = {**list_params(["pending", "running"], None), "tenant": "default"}
    with sql.transaction(force_rollback=True):
        before = listing_reads(sql)
        page = sql.execute(named_queries("queries.sql")["list_live_runs"], params).fetchall()
        read = most_read(before, listing_reads(sql))
    assert len(page) == (5 if backlog_of == "default" else 1)
    assert read < 100, read


@pytest.mark.parametrize("tenant", [None, "default"])
async def test_a_page_of_few_live_runs_reads_them_without_walking_the_newest_runs(
    sql: Conn, store: RunStore, tenant: str | None
) -> None:
    # With fewer live runs than a page, the walk of the newest runs (ten
    # pages' worth: 500 runs looked up for a page of 50) found less than a
    # page, and the partial indexes were read anyway; the walk was most of
    # the page's cost and grew with the history (migration 0053 counts the
    # live runs first). 3,000 finished runs newer than the 3 live ones.
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, created_at)"
        " SELECT 'a', '{}', 3, now() - interval '1 day' FROM generate_series(1, 3)"
    )
    assert len(await store.claim_batch(worker_id="w", limit=1, lease_seconds=300)) == 1
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, status, attempts, finished_at,"
        " created_at)"
        " SELECT 'a', '{}', 3, 'completed', 1, now(), now() - g * interval '1 ms'"
        " FROM generate_series(1, 3000) AS g"
    )
    sql.execute("ANALYZE runlane.runs, runlane.run_listing")
    params = {**list_params(["pending", "running"], None), "tenant": tenant, "limit": 50}
    query = named_queries("queries.sql")["list_live_runs"]
    live = newest_first(sql, ["pending", "running"])
    assert len(live) == 3
    for _ in range(7):  # prepared, as on a long-lived connection
        page, read, _ = read_page(sql, query, params, prepare=True)
        assert [row["id"] for row in page] == live
        assert read < 50, read
    # Pages of two, by the cursor: more live runs than a page, so the walk
    # (of 20) comes first again; the same runs in the same order.
    pages, reads = list_pages(sql, query, {**params, "limit": 2}, 2)
    assert pages == live
    assert max(reads) < 50, reads


@pytest.mark.parametrize("tenant", [None, "default"])
async def test_a_page_of_live_runs_behind_a_backlog_reads_the_page_and_no_more(
    sql: Conn, store: RunStore, tenant: str | None
) -> None:
    # Behind a backlog the newest runs are the page. The walk looked up
    # ten pages' worth of them (500 for a page of 50) whatever it had
    # found, and the count before it read the leased runs' index, which
    # while a backlog drains holds the entries of every run claimed and
    # ended until vacuum (migration 0054). 20 runs leased, 3,000 finished
    # and 600 pending newest.
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, created_at)"
        " SELECT 'a', '{}', 3, now() - interval '1 day' FROM generate_series(1, 20)"
    )
    assert len(await store.claim_batch(worker_id="w", limit=20, lease_seconds=300)) == 20
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, status, attempts, finished_at,"
        " created_at)"
        " SELECT 'a', '{}', 3, 'completed', 1, now(),"
        " now() - interval '1 hour' - g * interval '1 ms' FROM generate_series(1, 3000) AS g"
    )
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, created_at)"
        " SELECT 'a', '{}', 3, now() - g * interval '1 ms' FROM generate_series(1, 600) AS g"
    )
    sql.execute("ANALYZE runlane.runs, runlane.run_listing")
    params = {**list_params(["pending", "running"], None), "tenant": tenant, "limit": 50}
    query = named_queries("queries.sql")["list_live_runs"]
    live = newest_first(sql, ["pending", "running"])
    assert len(live) == 620
    for _ in range(7):  # prepared, as on a long-lived connection
        page, read, scanned = read_page(sql, query, params, prepare=True)
        assert "runs_leased_idx" not in scanned
        assert [row["id"] for row in page] == live[:50]
        # Rows of runs: the pending runs counted (50), the walk's lookups
        # to its page's end (50) and the page's runs read (50), where the
        # walk alone looked up 500.
        assert read < 200, read
    # Three pages by the cursor: the same runs in the same order.
    pages, reads = list_pages(sql, query, params, 3)
    assert pages == live[:150]
    assert max(reads) < 200, reads


@pytest.mark.parametrize("last_place", [50, 51])
async def test_a_walk_whose_page_ends_at_its_last_place_holds_the_page(
    sql: Conn, last_place: int
) -> None:
    # A tenant's page of 5 walks its 50 newest runs. The walk keeps its run
    # at the 50th place beside its matches, to tell a walk that reached its
    # limit (migration 0054): when that run is the page's last, the walk
    # holds the page; one place further it holds 4 of 5, and the live runs'
    # indexes are read instead. The same five runs either way. Completed
    # runs newest, then the five, then 300 older pending runs (one
    # transaction: one now()).
    with sql.transaction():
        sql.execute(
            "INSERT INTO runlane.runs (agent, input, max_attempts, status, attempts,"
            " finished_at, created_at)"
            " SELECT 'a', '{}', 3, 'completed', 1, now(), now() - g * interval '1 ms'"
            " FROM generate_series(1, %s) AS g",
            (last_place - 5,),
        )
        sql.execute(
            "INSERT INTO runlane.runs (agent, input, max_attempts, created_at)"
            " SELECT 'a', '{}', 3, now() - (%s + g) * interval '1 ms'"
            " FROM generate_series(1, 5) AS g",
            (last_place - 5,),
        )
        sql.execute(
            "INSERT INTO runlane.runs (agent, input, max_attempts, created_at)"
            " SELECT 'a', '{}', 3, now() - interval '1 hour' - g * interval '1 ms'"
            " FROM generate_series(1, 300) AS g"
        )
    sql.execute("ANALYZE runlane.runs, runlane.run_listing")
    params = list_params(["pending", "running"], None)
    live = newest_first(sql, ["pending", "running"])
    page, read, _ = read_page(sql, named_queries("queries.sql")["list_live_runs"], params)
    assert [row["id"] for row in page] == live[:5]
    if last_place == 50:
        assert read < 100, read  # 62 here; one place further, 362


@pytest.mark.parametrize("statuses", [None, ["pending"], ["pending", "running"]], ids=str)
async def test_an_operators_listing_among_many_tenants_reads_a_page(
    sql: Conn, statuses: list[str] | None
) -> None:
    # Without a tenant, a page was put together from a page of each tenant
    # (300 tenants: 300 pages read for one), and the live runs of more than
    # 16 tenants were read from the partial indexes, every pending run of a
    # backlog (migration 0044). 300 tenants' histories, then a backlog of
    # pending runs newer than them, every tenant's runs interleaved in time.
    sql.execute(
        "INSERT INTO runlane.runs (tenant, agent, input, max_attempts, status, finished_at,"
        " created_at)"
        " SELECT 't' || (g % 300), 'a', '{}', 3, 'completed', now(),"
        " now() - interval '1 hour' - g * interval '1 second'"
        " FROM generate_series(1, 3000) AS g"
    )
    sql.execute(
        "INSERT INTO runlane.runs (tenant, agent, input, max_attempts, created_at)"
        " SELECT 't' || (g % 300), 'a', '{}', 3, now() - g * interval '1 ms'"
        " FROM generate_series(1, 3000) AS g"
    )
    sql.execute("ANALYZE runlane.runs, runlane.run_listing")
    wanted = [RunStatus(s) for s in statuses] if statuses else None
    assert len(listing_parts(wanted)) == 1
    query = named_queries("queries.sql")[listing_query(wanted)]
    params = {**list_params(statuses or [], None), "tenant": None, "statuses": statuses}
    expected = newest_first(sql, statuses)
    pages, reads = list_pages(sql, query, params, 3)
    assert max(reads) < 100, reads
    assert pages == expected[:15]


async def test_an_operators_page_of_rare_statuses_reads_a_head_per_tenant_not_a_page(
    sql: Conn,
) -> None:
    # Without a tenant, the rare statuses are read tenant name hash by hash
    # (runs_exceptional_listing_idx begins with the hash). Only the hashes
    # whose newest run is among the page's newest can hold a run of the
    # page: each hash costs its newest run, and only those few hashes a
    # page. 200 tenants with 30 failed runs each, interleaved in time.
    sql.execute(
        "INSERT INTO runlane.runs (tenant, agent, input, max_attempts, status, finished_at,"
        " created_at)"
        " SELECT 't' || (g % 200), 'a', '{}', 3, 'failed', now(),"
        " now() - g * interval '1 ms' FROM generate_series(1, 6000) AS g"
    )
    sql.execute("ANALYZE runlane.runs, runlane.run_listing")
    query = named_queries("queries.sql")["list_exceptional_runs_of_every_tenant"]
    params = {**list_params(["failed"], None), "tenant": None, "limit": 20}
    expected = newest_first(sql, ["failed"])
    pages, reads = list_pages(sql, query, params, 2)
    # A page of each hash: 200 x 20 runs read (4,200 with the skip through
    # the hashes). A head of each, and a page of the 20 hashes holding the
    # newest heads: 800.
    assert max(reads) < 1000, reads
    assert pages == expected[:40]


def add_busy_lanes(sql: Conn, n: int) -> None:
    """n other lanes of tenant t, each with a request queued."""
    sql.execute(
        "INSERT INTO runlane.lanes (tenant, user_id, agent, thread_id)"
        " SELECT 't', 'u', 'a', 'other-' || g FROM generate_series(1, %s) AS g",
        (n,),
    )
    sql.execute(
        "INSERT INTO runlane.requests (request_id, tenant, lane_id, policy, status, input,"
        " max_attempts, request_order)"
        " SELECT 'r-' || l.id, 't', l.id, 'enqueue', 'queued', '{}', 3, 1"
        " FROM runlane.lanes AS l WHERE l.thread_id LIKE 'other-%%'"
    )


@pytest.fixture
async def one_connection_pool(db_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """A pool of one connection, as a long-lived worker's or API's: its
    statements run often enough there to keep plans."""
    pool = create_pool(db_url, min_size=1, max_size=1, check=False)
    await pool.open()
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
def api_connection(
    one_connection_pool: AsyncConnectionPool[Any], settings: Settings
) -> tuple[AsyncConnectionPool[Any], LaneService]:
    """One pool connection, as a long-lived API connection's, and a lane
    service over it."""
    pool = one_connection_pool
    return pool, LaneService(LaneStore(pool), RunService(RunStore(pool), settings))


async def test_a_long_lived_api_connections_lane_submits_keep_index_plans(
    api_connection: tuple[AsyncConnectionPool[Any], LaneService], sql: Conn
) -> None:
    # runlane.submit_request's statements keep their plans for the
    # connection once it has run often enough (as a prepared statement's),
    # here made while the lane tables held a few rows. Then other lanes
    # fill up; a submit must still find its lane, its request_id, its
    # lane's facts and its position through the indexes.
    pool, lanes = api_connection

    async def submit(thread_id: str, i: int) -> None:
        await lanes.submit(tenant="t", user_id="u", agent="a", thread_id=thread_id, input={"i": i})

    await submit("small", 0)
    sql.execute("ANALYZE runlane.lanes, runlane.requests, runlane.runs")
    for i in range(12):
        await submit("busy", i)  # the first dispatched, the rest queued
        await submit(f"idle-{i}", i)
    add_busy_lanes(sql, 3000)
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, status, finished_at)"
        " SELECT 'a', '{}', 3, 'completed', now() FROM generate_series(1, 3000)"
    )
    tables = ("lanes", "requests", "runs")
    before = await pool_rows_read(pool, tables)
    await submit("busy", 12)
    await submit("idle-new", 12)
    assert await pool_rows_read(pool, tables) - before < 100


async def test_a_long_lived_api_connections_direct_submits_keep_index_plans(
    one_connection_pool: AsyncConnectionPool[Any], settings: Settings, sql: Conn
) -> None:
    # A direct submit looks for a parked worker and, when it finds one, for
    # a run of its agent already waiting (which the worker must take
    # first). Its plan is kept for the API's connection once the submit
    # has run often enough, here while runs held a few rows; then the
    # history and another agent's backlog grow. A submit must still read
    # a few rows, parked worker or not.
    service = RunService(RunStore(one_connection_pool), settings)
    await service.submit("a", {"i": 0})
    sql.execute("ANALYZE runlane.runs")
    sql.execute(
        "INSERT INTO runlane.standing_claims (worker_id, agents, lease_seconds, expires_at)"
        " VALUES ('w', NULL, 30, now() + interval '10 minutes')"
    )
    for i in range(12):
        run, _ = await service.submit("a", {"i": i})
        assert run.status is RunStatus.PENDING  # the first run is waiting
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, status, finished_at)"
        " SELECT 'a', '{}', 3, 'completed', now() FROM generate_series(1, 3000)"
    )
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts)"
        " SELECT 'b', '{}', 3 FROM generate_series(1, 3000)"
    )
    tables = ("runs", "standing_claims")
    before = await pool_rows_read(one_connection_pool, tables)
    waiting, _ = await service.submit("a", {"i": 12})
    assert waiting.status is RunStatus.PENDING
    assert await pool_rows_read(one_connection_pool, tables) - before < 100
    before = await pool_rows_read(one_connection_pool, tables)
    pushed, _ = await service.submit("c", {"i": 13})  # nothing of c waits
    assert pushed.status is RunStatus.RUNNING
    assert await pool_rows_read(one_connection_pool, tables) - before < 100
    # A repeated idempotency key answers the run it made, by its index.
    keyed, created = await service.submit("a", {"i": 14}, idempotency_key="k-1")
    assert created
    before = await pool_rows_read(one_connection_pool, tables)
    again, created = await service.submit("a", {"i": 14}, idempotency_key="k-1")
    assert not created and again.id == keyed.id
    assert await pool_rows_read(one_connection_pool, tables) - before < 100


async def test_a_long_lived_api_connections_request_reads_keep_index_plans(
    api_connection: tuple[AsyncConnectionPool[Any], LaneService], sql: Conn
) -> None:
    # A client polls its request (GET /v1/requests/{id}); the reads are
    # prepared on the API's connection while the lane tables are small,
    # then other lanes fill up.
    pool, lanes = api_connection
    for i in range(3):
        await lanes.submit(
            tenant="t",
            user_id="u",
            agent="a",
            thread_id="busy",
            input={"i": i},
            request_id=f"mine-{i}",
        )
    sql.execute("ANALYZE runlane.lanes, runlane.requests, runlane.runs")
    for _ in range(12):
        request = await lanes.get_request(tenant="t", request_id="mine-2")
        assert request.position == 2
    add_busy_lanes(sql, 3000)
    tables = ("lanes", "requests", "runs")
    before = await pool_rows_read(pool, tables)
    request = await lanes.get_request(tenant="t", request_id="mine-2")
    assert request.position == 2
    assert await pool_rows_read(pool, tables) - before < 100


async def test_a_long_lived_worker_connections_recovery_pass_keeps_index_plans(
    one_connection_pool: AsyncConnectionPool[Any], sql: Conn
) -> None:
    # Every worker runs the lane recovery pass every reaper interval on a
    # connection of its pool. Its scans are prepared there while the lane
    # tables are small; then the history grows: 3,000 lanes with four
    # dispatched requests and four finished runs each, and three lanes that
    # a crash left with a request queued and no run. A pass must find those
    # three and dispatch them without reading the history (3,030 rows read
    # here before migration 0023, 33 after).
    pool = one_connection_pool
    store = LaneStore(pool)
    sql.execute("ANALYZE runlane.lanes, runlane.requests, runlane.runs")
    for _ in range(7):
        assert await store.recover() == RecoveryResult(dispatched=0, interrupts_expired=0)
    sql.execute(
        "INSERT INTO runlane.lanes (tenant, user_id, agent, thread_id)"
        " SELECT 't', 'u', 'a', 'old-' || g FROM generate_series(1, 3003) AS g"
    )
    sql.execute(
        "INSERT INTO runlane.requests (request_id, tenant, lane_id, policy, status, input,"
        " max_attempts, request_order, dispatched_at)"
        " SELECT 'r-' || l.id || '-' || g, 't', l.id, 'enqueue', 'dispatched', '{}', 3, g,"
        " now() FROM runlane.lanes AS l, generate_series(1, 4) AS g"
    )
    sql.execute(
        "INSERT INTO runlane.runs (tenant, agent, input, max_attempts, status, finished_at,"
        " lane_id, thread_id)"
        " SELECT 't', 'a', '{}', 3, 'completed', now(), l.id, l.thread_id"
        " FROM runlane.lanes AS l, generate_series(1, 4)"
    )
    stranded = [
        row[0]
        for row in sql.execute(
            "INSERT INTO runlane.requests (request_id, tenant, lane_id, policy, status,"
            " input, max_attempts, request_order)"
            " SELECT 'q-' || l.id, 't', l.id, 'enqueue', 'queued', '{}', 3, 10"
            " FROM runlane.lanes AS l WHERE l.thread_id IN ('old-1', 'old-2', 'old-3')"
            " RETURNING lane_id"
        ).fetchall()
    ]
    tables = ("lanes", "requests", "runs")
    before = await pool_rows_read(pool, tables)
    assert await store.recover() == RecoveryResult(dispatched=3, interrupts_expired=0)
    assert await pool_rows_read(pool, tables) - before < 200
    active = sql.execute(
        "SELECT lane_id FROM runlane.runs WHERE status = 'pending' ORDER BY lane_id"
    ).fetchall()
    assert [row[0] for row in active] == sorted(stranded)


async def test_a_long_lived_connections_queue_gauges_read_only_live_runs(
    one_connection_pool: AsyncConnectionPool[Any], sql: Conn
) -> None:
    # A worker refreshes its queue gauges every few seconds on a connection
    # of its pool, and the dashboard polls them with the waiting lanes: the
    # reads are prepared there while the tables are small, then the history
    # grows (migration 0024). The counts must come from the live runs and
    # the waiting lanes alone.
    pool = one_connection_pool
    store = RunStore(pool)
    sql.execute("ANALYZE runlane.runs, runlane.lanes")
    for _ in range(7):
        assert await store.queue_gauges() == []
        assert await store.waiting_lanes() == []
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, status, finished_at)"
        " SELECT 'a', '{}', 3, 'completed', now() FROM generate_series(1, 3000)"
    )
    add_pending_runs(sql, 5)
    sql.execute(
        "INSERT INTO runlane.runs (agent, input, max_attempts, status, lease_token, worker_id,"
        " lease_expires_at) SELECT 'a', '{}', 3, 'running', gen_random_uuid(), 'w',"
        " now() + interval '1 minute' FROM generate_series(1, 2)"
    )
    sql.execute(
        "INSERT INTO runlane.lanes (tenant, user_id, agent, thread_id)"
        " SELECT 't', 'u', 'a', 'quiet-' || g FROM generate_series(1, 3000) AS g"
    )
    before = await pool_rows_read(pool, ("runs", "lanes"))
    gauges = await store.queue_gauges()
    waiting = await store.waiting_lanes()
    assert await pool_rows_read(pool, ("runs", "lanes")) - before < 100
    assert [(g["status"], g["agent"], g["count"]) for g in gauges] == [
        ("pending", "a", 5),
        ("running", "a", 2),
    ]
    assert gauges[0]["oldest_pending_seconds"] is not None
    assert gauges[1]["oldest_pending_seconds"] is None
    assert waiting == []


@pytest.mark.parametrize("in_utc", [False, True], ids=["api", "worker"])
async def test_runlanes_sessions_never_compile_a_statement(
    db_url: str, sql: Conn, in_utc: bool
) -> None:
    # JIT compiling a plan costs tens of milliseconds at every call, and a
    # listing whose estimate over a long history passed jit_above_cost was
    # compiled at every call for well under a millisecond of work (thirty-
    # fourth session). Here every statement's estimate passes it, for any
    # session of this database, but runlane's.
    sql.execute(
        f'ALTER DATABASE "{sql.info.dbname}" SET jit_above_cost = 0;'
        f' ALTER DATABASE "{sql.info.dbname}" SET jit_inline_above_cost = -1;'
        f' ALTER DATABASE "{sql.info.dbname}" SET jit_optimize_above_cost = -1'
    )
    explain = "EXPLAIN (ANALYZE, TIMING OFF) " + ClientCursor(sql).mogrify(
        named_queries("queries.sql")["list_exceptional_runs_of_every_tenant"],
        {**list_params(["failed"], None), "tenant": None},
    )
    with psycopg.connect(db_url, autocommit=True) as other:
        jit_available = other.execute("SELECT pg_jit_available()").fetchone() == (True,)
        other_plan = "\n".join(str(row[0]) for row in other.execute(explain).fetchall())
    # A session that is not runlane's compiles it, where the server can.
    assert ("JIT:" in other_plan) == jit_available
    pool = create_pool(db_url, min_size=1, max_size=1, check=False, in_utc=in_utc)
    await pool.open()
    try:
        async with pool.connection() as conn:
            setting = await (await conn.execute("SHOW jit")).fetchone()
            rows = await (await conn.execute(explain)).fetchall()
    finally:
        await pool.close()
    assert setting == {"jit": "off"}
    assert not any("JIT:" in str(next(iter(row.values()))) for row in rows)
