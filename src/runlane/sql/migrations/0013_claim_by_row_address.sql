-- The uncapped claim updates the runs it picked by their row address.
--
-- With the plans of 0012 kept for the session, the claim's UPDATE found its
-- runs by `id = ANY(picked)`, and a plan made while the table held a run or
-- two saw every index that contains `id` as equally cheap: in the wake-up
-- benchmark the kept plan read runs_owner_listing_idx whole (id is its last
-- column) for every claim, 19-40 ms each with 30,000 runs stored, and the
-- worker fell behind. The candidates now carry their ctid, and the UPDATE
-- matches `ctid = ANY(picked)`: a TID scan, the one plan left with
-- sequential and bitmap scans off, whatever the table held when it was
-- planned. The addresses are stable: the candidates are locked FOR UPDATE
-- in this transaction, so no one else can update, delete or move them
-- before the UPDATE, and this transaction does not touch them in between.
--
-- Otherwise the function is 0009's, with 0012's settings.
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
                WHERE status = 'pending' AND agent = a.agent AND available_at <= now()
                  AND attempts < max_attempts
                ORDER BY priority DESC, available_at, seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
            UNION
            SELECT c.* FROM unnest(p_agents) AS a(agent) CROSS JOIN LATERAL (
                SELECT ctid, id, priority, available_at, seq FROM runlane.runs
                WHERE status = 'pending' AND agent = a.agent AND available_at <= now()
                  AND attempts < max_attempts AND p_aging_seconds > 0
                ORDER BY available_at, seq
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
