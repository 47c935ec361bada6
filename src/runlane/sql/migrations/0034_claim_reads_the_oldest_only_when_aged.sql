-- The uncapped claim reads and locks the oldest runs only when one of
-- them may have aged.
--
-- With priority aging on (the worker's default, one point per 10 s), the
-- claim of 0009-0027 read two candidate lists with FOR UPDATE SKIP
-- LOCKED, the first runs by priority and the oldest, and claimed the best
-- of both by effective priority (priority plus a point per aging interval
-- waited). While no pending run has waited a whole interval, every
-- effective priority is the plain priority, the first by priority are the
-- claim's, and the oldest were read and locked for nothing: locked until
-- the claim's commit, so other workers' claims skipped them meanwhile.
-- Now one look at an age index (the oldest available run, read without
-- a lock) decides whether the second list is read. With a backlog that
-- has waited longer, the claim is what it was.
--
-- Counted with callgrind (twenty-second session, BENCHMARKS.md section 1):
-- a backend claiming 200 young runs at a time with aging on and finishing
-- them runs 2-4% fewer instructions per run (PostgreSQL 15 and 18, with
-- and without an agent list). The capped claim (claim_capped_runs, taken
-- while any tenant has a cap) is unchanged.
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
    -- Some candidate has waited p_aging_seconds or more, so aging may
    -- rank it above the first by priority. While none has, every run's
    -- effective priority is its priority and the first by priority are
    -- the claim's: the oldest need not be read and locked.
    aged boolean := false;
BEGIN
    -- The oldest run available (per agent), as by_age below would read it
    -- first but without a lock, and whether it waited a whole period. Its
    -- age is tested after the index gave it: an index condition on
    -- available_at would not end the scan of an agent's entries, which
    -- the agent's range (see below) keeps from being an equality.
    IF p_aging_seconds > 0 THEN
        IF p_agents IS NULL THEN
            aged := EXISTS (
                SELECT FROM (
                    SELECT available_at FROM runlane.runs
                    WHERE status = 'pending' AND available_at <= now()
                      AND attempts < max_attempts
                    ORDER BY available_at, seq
                    LIMIT 1
                ) AS oldest
                WHERE oldest.available_at <= now() - make_interval(secs => p_aging_seconds));
        ELSE
            aged := EXISTS (
                SELECT FROM unnest(p_agents) AS a(agent) CROSS JOIN LATERAL (
                    SELECT available_at FROM runlane.runs
                    WHERE status = 'pending' AND agent >= a.agent AND agent <= a.agent
                      AND available_at <= now() AND attempts < max_attempts
                    ORDER BY agent, available_at, seq
                    LIMIT 1
                ) AS oldest
                WHERE oldest.available_at <= now() - make_interval(secs => p_aging_seconds));
        END IF;
    END IF;
    -- Candidates: the first runs by priority and, once some run has
    -- aged, the oldest runs, locked with SKIP LOCKED; the best p_limit by
    -- effective priority are claimed, the others unlocked at commit.
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
              AND aged
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
                  AND available_at <= now() AND attempts < max_attempts AND aged
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
END;
$$;
