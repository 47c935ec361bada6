-- The capped claim's per-agent candidates are pinned to the per-agent
-- claim indexes, as the uncapped claim's are since 0014.
--
-- The capped claim (used while any tenant has a cap) plans every call, but
-- each of a worker's agents is matched in a lateral subquery, so its plan
-- is made without knowing the agent. With statistics taken while no run
-- was pending, PostgreSQL took a scan of all pending runs in claim order
-- (runs_claim_idx, runs_pending_age_idx) filtered by agent as cheap as the
-- per-agent index: a worker whose agent had five runs waiting behind
-- 3,000 of another agent read 6,027 rows for one claim
-- (tests/integration/test_query_plans.py). As in 0014, the agent is now
-- matched by a range that admits only it, the candidates are ordered by
-- agent first, and sorts are off while the candidates are planned, so
-- only the per-agent indexes give that order without a sort. Sorts are on
-- again for the ranking that follows: with them off, PostgreSQL walked
-- the whole listing index to get the candidates in tenant order rather
-- than sort five rows (4,027 rows read in the same test).
--
-- Otherwise the function is 0017's.
CREATE OR REPLACE FUNCTION runlane.claim_capped_runs(
    p_worker_id text,
    p_agents text[],
    p_limit integer,
    p_lease_seconds double precision,
    p_aging_seconds double precision
) RETURNS SETOF runlane.runs
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
SET enable_sort = on
AS $$
DECLARE
    locked_caps text[];
    busy_caps text[];
    free_tenants text[];
    free_slots bigint[];
    candidates uuid[];
BEGIN
    SELECT coalesce(array_agg(tenant), '{}') INTO locked_caps
    FROM (SELECT tenant FROM runlane.tenant_limits FOR UPDATE SKIP LOCKED) AS l;
    -- The free slots of the caps this claim holds, counted once: no other
    -- claimer can fill them while the cap rows are locked, and a count
    -- taken now can only be too high (runs may end meanwhile), never let
    -- a tenant past its cap.
    SELECT coalesce(array_agg(t.tenant), '{}'), coalesce(array_agg(greatest(t.max_running - (
               SELECT count(*) FROM runlane.runs AS x
               WHERE x.tenant = t.tenant AND x.status IN ('running', 'cancel_requested')), 0)),
           '{}')
    INTO free_tenants, free_slots
    FROM runlane.tenant_limits AS t
    WHERE t.tenant = ANY(locked_caps);
    -- Left out of the candidates: caps another claimer holds, and caps
    -- this claim holds whose tenant has no free slot.
    SELECT coalesce(array_agg(t.tenant), '{}') INTO busy_caps
    FROM runlane.tenant_limits AS t
    WHERE NOT t.tenant = ANY(locked_caps);
    SELECT busy_caps || coalesce(array_agg(f.tenant), '{}') INTO busy_caps
    FROM unnest(free_tenants, free_slots) AS f(tenant, free)
    WHERE f.free = 0;

    -- Sorts off for the candidates only (restored at the function's exit
    -- by its SET clause): the ranking below must sort, and with sorts off
    -- it would walk a whole index for the tenant order instead.
    SET LOCAL enable_sort = off;
    IF p_agents IS NULL THEN
        WITH by_priority AS (
            SELECT id FROM runlane.runs
            WHERE status = 'pending' AND available_at <= now() AND attempts < max_attempts
              AND NOT tenant = ANY(busy_caps)
            ORDER BY priority DESC, available_at, seq
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ), by_age AS (
            SELECT id FROM runlane.runs
            WHERE status = 'pending' AND available_at <= now() AND attempts < max_attempts
              AND NOT tenant = ANY(busy_caps)
              AND p_aging_seconds > 0
            ORDER BY available_at, seq
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        )
        SELECT array_agg(DISTINCT id) INTO candidates
        FROM (SELECT id FROM by_priority UNION ALL SELECT id FROM by_age) AS c;
    ELSE
        WITH by_priority AS (
            SELECT c.id FROM unnest(p_agents) AS a(agent)
            CROSS JOIN LATERAL (
                SELECT id FROM runlane.runs
                WHERE status = 'pending' AND agent >= a.agent AND agent <= a.agent
                  AND available_at <= now()
                  AND attempts < max_attempts AND NOT tenant = ANY(busy_caps)
                ORDER BY agent, priority DESC, available_at, seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
        ), by_age AS (
            SELECT c.id FROM unnest(p_agents) AS a(agent)
            CROSS JOIN LATERAL (
                SELECT id FROM runlane.runs
                WHERE status = 'pending' AND agent >= a.agent AND agent <= a.agent
                  AND available_at <= now()
                  AND attempts < max_attempts AND NOT tenant = ANY(busy_caps)
                  AND p_aging_seconds > 0
                ORDER BY agent, available_at, seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
        )
        SELECT array_agg(DISTINCT id) INTO candidates
        FROM (SELECT id FROM by_priority UNION ALL SELECT id FROM by_age) AS c;
    END IF;
    SET LOCAL enable_sort = on;

    IF candidates IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH scored AS (
        SELECT r.id, r.tenant, r.available_at, r.seq,
               r.priority + CASE WHEN p_aging_seconds > 0
                   THEN floor(extract(epoch FROM now() - r.available_at) / p_aging_seconds)
                   ELSE 0 END AS effective_priority
        FROM runlane.runs AS r
        WHERE r.id = ANY(candidates)
    ), slots AS (
        SELECT * FROM unnest(free_tenants, free_slots) AS s(tenant, free)
    ), ranked AS (
        SELECT scored.*, slots.free,
               row_number() OVER (PARTITION BY scored.tenant
                                  ORDER BY effective_priority DESC, available_at, seq)
                   AS tenant_rank
        FROM scored LEFT JOIN slots ON slots.tenant = scored.tenant
    ), picked AS (
        SELECT id FROM ranked
        WHERE free IS NULL OR tenant_rank <= free
        ORDER BY effective_priority DESC, available_at, seq
        LIMIT p_limit
    ), claimed AS (
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
        FROM picked
        WHERE r.id = picked.id
        RETURNING r.*
    ), attempt_rows AS (
        INSERT INTO runlane.run_attempts (run_id, attempt, worker_id, lease_token)
        SELECT id, claim_count, worker_id, lease_token FROM claimed
    )
    SELECT * FROM claimed;
END;
$$;
