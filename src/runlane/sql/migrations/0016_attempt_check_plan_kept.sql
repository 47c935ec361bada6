-- The uncapped claim checks its attempt rows' foreign key itself, with
-- pinned plans, instead of leaving the check to the commit.
--
-- Since 0010 the check (one lookup of runs per claimed run) waited for the
-- commit and ran under the session's settings, where PostgreSQL keeps one
-- plan for it per session, made from the statistics of that moment. Made
-- while runs was analyzed with a few dozen rows, that plan is a
-- sequential scan (cheaper than the index on such a table), and it stayed
-- in use as the table grew, until the next ANALYZE: each claimed run's
-- check then read runs up to the run's new row version, which an update
-- can put near the end of the table (3 ms per claimed run with 30,000
-- runs stored; tests/integration/test_query_plans.py).
--
-- The uncapped claim now fires the waiting checks at its end (SET
-- CONSTRAINTS ... IMMEDIATE), under its own settings (0012: one plan per
-- session, sequential and bitmap scans off), so the plan kept is the
-- primary-key lookup; it then defers the constraint again for the rest of
-- the transaction. The capped claim still leaves the check to the commit:
-- inside it, its force_custom_plan would plan the check again for every
-- claimed run (why 0010 deferred it). A separate function with these
-- settings, called at the end of claim_runs for both paths, was tried
-- first; the lane relay measured slower with it (BENCHMARKS.md, sixth
-- session).
--
-- Otherwise the function is 0014's.
CREATE OR REPLACE FUNCTION runlane.claim_uncapped_runs(
    p_worker_id text,
    p_agents text[],
    p_limit integer,
    p_lease_seconds double precision,
    p_aging_seconds double precision
) RETURNS SETOF runlane.runs
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET jit = off
AS $$
DECLARE
    picked tid[];
BEGIN
    -- Candidates: the first runs by priority and the oldest runs (for
    -- aging), locked with SKIP LOCKED; the best p_limit by effective
    -- priority are claimed, the others unlocked at commit.
    IF p_agents IS NULL THEN
        WITH by_priority AS (
            SELECT ctid, id, priority, available_at, seq FROM runlane.runs
            WHERE status = 'pending' AND available_at <= now() AND attempts < max_attempts
            ORDER BY priority DESC, available_at, seq
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ), by_age AS (
            SELECT ctid, id, priority, available_at, seq FROM runlane.runs
            WHERE status = 'pending' AND available_at <= now() AND attempts < max_attempts
              AND p_aging_seconds > 0
            ORDER BY available_at, seq
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ), candidates AS (
            SELECT * FROM by_priority UNION SELECT * FROM by_age
        )
        SELECT array_agg(ctid) INTO picked FROM (
            SELECT c.ctid FROM candidates AS c
            ORDER BY c.priority + CASE WHEN p_aging_seconds > 0
                         THEN floor(extract(epoch FROM now() - c.available_at) / p_aging_seconds)
                         ELSE 0 END DESC,
                     c.available_at, c.seq
            LIMIT p_limit
        ) AS best;
    ELSE
        WITH candidates AS (
            SELECT c.* FROM unnest(p_agents) AS a(agent) CROSS JOIN LATERAL (
                SELECT ctid, id, priority, available_at, seq FROM runlane.runs
                WHERE status = 'pending' AND agent >= a.agent AND agent <= a.agent
                  AND available_at <= now() AND attempts < max_attempts
                ORDER BY agent, priority DESC, available_at, seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
            UNION
            SELECT c.* FROM unnest(p_agents) AS a(agent) CROSS JOIN LATERAL (
                SELECT ctid, id, priority, available_at, seq FROM runlane.runs
                WHERE status = 'pending' AND agent >= a.agent AND agent <= a.agent
                  AND available_at <= now() AND attempts < max_attempts AND p_aging_seconds > 0
                ORDER BY agent, available_at, seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
        )
        SELECT array_agg(ctid) INTO picked FROM (
            SELECT c.ctid FROM candidates AS c
            ORDER BY c.priority + CASE WHEN p_aging_seconds > 0
                         THEN floor(extract(epoch FROM now() - c.available_at) / p_aging_seconds)
                         ELSE 0 END DESC,
                     c.available_at, c.seq
            LIMIT p_limit
        ) AS best;
    END IF;

    IF picked IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH claimed AS (
        UPDATE runlane.runs AS r
        SET status = 'running',
            attempts = r.attempts + 1,
            claim_count = r.claim_count + 1,
            lease_token = gen_random_uuid(),
            lease_expires_at = now() + make_interval(secs => p_lease_seconds),
            worker_id = p_worker_id,
            started_at = coalesce(r.started_at, now()),
            deadline_at = coalesce(r.deadline_at, now() + make_interval(secs =>
                least((r.budget ->> 'max_seconds')::double precision, 31536000)))
        WHERE r.ctid = ANY(picked)
        RETURNING r.*
    ), attempt_rows AS (
        INSERT INTO runlane.run_attempts (run_id, attempt, worker_id, lease_token)
        SELECT id, claim_count, worker_id, lease_token FROM claimed
    )
    SELECT * FROM claimed;

    -- The attempts' foreign-key checks, here rather than at commit: under
    -- this function's settings, so that the plan kept for them is the
    -- primary-key lookup. Deferred again for the rest of the transaction.
    SET CONSTRAINTS runlane.run_attempts_run_id_fkey IMMEDIATE;
    SET CONSTRAINTS runlane.run_attempts_run_id_fkey DEFERRED;
END;
$$;
