-- A cheaper claim for the common case: no tenant has a cap.
--
-- runlane.claim_runs (0006) runs four statements and PostgreSQL plans each
-- of them again on every call, which costs more than the claim's own work:
-- about 1 ms of a 1.5-2 ms single-run claim on the benchmark machine
-- (BENCHMARKS.md, sections 1 and 2).
--
-- So when runlane.tenant_limits is empty, claim_runs hands over to
-- runlane.claim_uncapped_runs: two statements, simpler to plan. The
-- candidate lists carry the columns the ranking needs (no join back to
-- runs), and the update finds its rows by primary key from an array.
-- Ordering, aging, SKIP LOCKED, attempt counting, lease token and the
-- attempts row are those of claim_runs; with caps, the 0006 claim runs,
-- renamed runlane.claim_capped_runs.
--
-- Both claim functions plan every call (force_custom_plan). A plan kept
-- for the session is cheaper, but it is made from the statistics of the
-- moment: one made while the queue was empty (a seq scan and a sort are
-- the cheapest way to read nothing) stays in use when a backlog of tens of
-- thousands arrives, until the next ANALYZE, and makes every claim 10-20
-- times slower (measured: 24 ms against 1.7 ms for 10 runs out of 30,000
-- pending). With the default plan_cache_mode PostgreSQL switches to such a
-- kept plan after five calls, so the 0006 claim had that trap too.
--
-- A cap created while a claim is under way applies from the next claim,
-- as before: a claim never saw caps committed after its snapshot.
CREATE FUNCTION runlane.claim_uncapped_runs(
    p_worker_id text,
    p_agents text[],
    p_limit integer,
    p_lease_seconds double precision,
    p_aging_seconds double precision
) RETURNS SETOF runlane.runs
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
    picked uuid[];
BEGIN
    -- Candidates: the first runs by priority and the oldest runs (for
    -- aging), locked with SKIP LOCKED; the best p_limit by effective
    -- priority are claimed, the others unlocked at commit.
    IF p_agents IS NULL THEN
        WITH by_priority AS (
            SELECT id, priority, available_at, seq FROM runlane.runs
            WHERE status = 'pending' AND available_at <= now() AND attempts < max_attempts
            ORDER BY priority DESC, available_at, seq
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ), by_age AS (
            SELECT id, priority, available_at, seq FROM runlane.runs
            WHERE status = 'pending' AND available_at <= now() AND attempts < max_attempts
              AND p_aging_seconds > 0
            ORDER BY available_at, seq
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ), candidates AS (
            SELECT * FROM by_priority UNION SELECT * FROM by_age
        )
        SELECT array_agg(id) INTO picked FROM (
            SELECT id FROM candidates AS c
            ORDER BY c.priority + CASE WHEN p_aging_seconds > 0
                         THEN floor(extract(epoch FROM now() - c.available_at) / p_aging_seconds)
                         ELSE 0 END DESC,
                     c.available_at, c.seq
            LIMIT p_limit
        ) AS best;
    ELSE
        WITH candidates AS (
            SELECT c.* FROM unnest(p_agents) AS a(agent) CROSS JOIN LATERAL (
                SELECT id, priority, available_at, seq FROM runlane.runs
                WHERE status = 'pending' AND agent = a.agent AND available_at <= now()
                  AND attempts < max_attempts
                ORDER BY priority DESC, available_at, seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
            UNION
            SELECT c.* FROM unnest(p_agents) AS a(agent) CROSS JOIN LATERAL (
                SELECT id, priority, available_at, seq FROM runlane.runs
                WHERE status = 'pending' AND agent = a.agent AND available_at <= now()
                  AND attempts < max_attempts AND p_aging_seconds > 0
                ORDER BY available_at, seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
        )
        SELECT array_agg(id) INTO picked FROM (
            SELECT id FROM candidates AS c
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
        WHERE r.id = ANY(picked)
        RETURNING r.*
    ), attempt_rows AS (
        INSERT INTO runlane.run_attempts (run_id, attempt, worker_id, lease_token)
        SELECT id, claim_count, worker_id, lease_token FROM claimed
    )
    SELECT * FROM claimed;
END;
$$;

-- The claim of 0006, kept for when caps exist; claim_runs picks the path.
ALTER FUNCTION runlane.claim_runs(text, text[], integer, double precision, double precision)
    RENAME TO claim_capped_runs;
ALTER FUNCTION runlane.claim_capped_runs(text, text[], integer, double precision, double precision)
    SET plan_cache_mode = force_custom_plan;

CREATE FUNCTION runlane.claim_runs(
    p_worker_id text,
    p_agents text[],
    p_limit integer,
    p_lease_seconds double precision,
    p_aging_seconds double precision
) RETURNS SETOF runlane.runs
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM runlane.tenant_limits) THEN
        RETURN QUERY SELECT * FROM runlane.claim_capped_runs(
            p_worker_id, p_agents, p_limit, p_lease_seconds, p_aging_seconds);
    ELSE
        RETURN QUERY SELECT * FROM runlane.claim_uncapped_runs(
            p_worker_id, p_agents, p_limit, p_lease_seconds, p_aging_seconds);
    END IF;
END;
$$;
