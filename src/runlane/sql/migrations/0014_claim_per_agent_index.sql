-- The uncapped claim's per-agent candidates are pinned to the per-agent
-- claim indexes.
--
-- Each of a worker's agents is matched in a lateral subquery, so the plan
-- kept since 0012 is made without knowing the agent. With statistics taken
-- while no run was pending, PostgreSQL saw a scan of runs_claim_idx or
-- runs_pending_age_idx (all pending runs in claim order) filtered by agent
-- as cheap as the per-agent index, and chose it: a worker whose agent had
-- five runs waiting behind 20,000 of another agent read all 20,000 for
-- every claim (10-15 ms; the claim planned on each call before 0012 did
-- the same, 21 ms). The agent is now matched by a range that admits only
-- that agent (>= and <= it, the same as = under the database's
-- deterministic collation) and the rows are ordered by agent first: an
-- equality would make that ordering redundant, a range does not, so only
-- the per-agent indexes (agent first) give the order without a sort, and
-- sorts are off inside the function.
--
-- Otherwise the function is 0013's.
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
END;
$$;
