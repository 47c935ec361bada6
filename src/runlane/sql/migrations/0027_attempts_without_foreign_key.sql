-- run_attempts without a foreign key to runs: its rows go with their run
-- through a statement-level trigger instead.
--
-- Every attempt row is written by the statement that claims its run (or
-- inserts it already claimed: a push to a parked worker, a lane's
-- dispatch), from the run row that statement has just written and still
-- holds locked, so the row it points at exists by construction. The
-- foreign key's check proved it again for every claimed run, a lookup of
-- runs that also locks the run row version the claim has just written,
-- and since 0016 and 0018 that check ran with pinned plans inside the
-- claim. Counted with callgrind (eighteenth session, BENCHMARKS.md
-- section 1), a backend claiming 200 runs at a time and finishing them ran
-- 6.6% fewer instructions per run without the key; timings on that
-- machine were too noisy to show it.
--
-- What the key also did, ON DELETE CASCADE, runlane.runs_delete_attempts
-- does: after any DELETE of runs (the pruner's, an operator's, a lane's
-- cascade), one DELETE of the attempts of the runs it deleted, reaching
-- them through run_attempts' primary key (run_id first) whatever the
-- statistics say. TRUNCATE fires no such trigger: runs truncated alone
-- leave their attempts (TRUNCATE ... CASCADE truncated both before).
ALTER TABLE runlane.run_attempts DROP CONSTRAINT run_attempts_run_id_fkey;

CREATE FUNCTION runlane.delete_attempts_of_deleted_runs() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
BEGIN
    DELETE FROM runlane.run_attempts AS a USING deleted_runs AS d WHERE a.run_id = d.id;
    RETURN NULL;
END;
$$;

CREATE TRIGGER runs_delete_attempts
    AFTER DELETE ON runlane.runs
    REFERENCING OLD TABLE AS deleted_runs
    FOR EACH STATEMENT EXECUTE FUNCTION runlane.delete_attempts_of_deleted_runs();

-- The capped claim's check (0018) is gone with the key.
CREATE OR REPLACE FUNCTION runlane.claim_runs(
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

DROP FUNCTION runlane.check_claimed_attempts();

-- The uncapped claim of 0016 without the check it fired at its end.
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
