-- Tenant concurrency caps and priority aging, in one claim function.

CREATE TABLE runlane.tenant_limits (
    tenant      text        PRIMARY KEY,
    max_running integer     NOT NULL CHECK (max_running >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The oldest pending runs, for aging (overall and per agent).
CREATE INDEX runs_pending_age_idx ON runlane.runs (available_at, seq)
    WHERE status = 'pending';
CREATE INDEX runs_pending_age_by_agent_idx ON runlane.runs (agent, available_at, seq)
    WHERE status = 'pending';

-- Claims up to p_limit pending runs (of p_agents, or of any agent when
-- NULL) for p_worker_id, in one transaction:
--   * candidates: the first runs by priority and the oldest runs, taken
--     with SKIP LOCKED so concurrent claimers get different rows;
--   * effective priority = priority + one point per p_aging_seconds waited
--     (no aging when p_aging_seconds <= 0), so a low priority run under a
--     steady stream of higher priority work still starts: after waiting
--     (difference in priority + 1) * p_aging_seconds it outranks new work;
--   * tenant caps: a tenant at its max_running gets nothing; the caps this
--     call can lock (SKIP LOCKED) are counted after the lock is held, so
--     two claimers never both fill the last slot; a cap another claimer
--     holds right now sits this round out.
-- Each claim counts an attempt, takes a fresh lease token and writes an
-- attempts row. Statements in a function take fresh snapshots, which the
-- cap count relies on.
CREATE FUNCTION runlane.claim_runs(
    p_worker_id text,
    p_agents text[],
    p_limit integer,
    p_lease_seconds double precision,
    p_aging_seconds double precision
) RETURNS SETOF runlane.runs
LANGUAGE plpgsql AS $$
DECLARE
    locked_caps text[];
    busy_caps text[];
    candidates uuid[];
BEGIN
    SELECT coalesce(array_agg(tenant), '{}') INTO locked_caps
    FROM (SELECT tenant FROM runlane.tenant_limits FOR UPDATE SKIP LOCKED) AS l;
    SELECT coalesce(array_agg(tenant), '{}') INTO busy_caps
    FROM runlane.tenant_limits WHERE NOT tenant = ANY(locked_caps);

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
                WHERE status = 'pending' AND agent = a.agent AND available_at <= now()
                  AND attempts < max_attempts AND NOT tenant = ANY(busy_caps)
                ORDER BY priority DESC, available_at, seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
        ), by_age AS (
            SELECT c.id FROM unnest(p_agents) AS a(agent)
            CROSS JOIN LATERAL (
                SELECT id FROM runlane.runs
                WHERE status = 'pending' AND agent = a.agent AND available_at <= now()
                  AND attempts < max_attempts AND NOT tenant = ANY(busy_caps)
                  AND p_aging_seconds > 0
                ORDER BY available_at, seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
        )
        SELECT array_agg(DISTINCT id) INTO candidates
        FROM (SELECT id FROM by_priority UNION ALL SELECT id FROM by_age) AS c;
    END IF;

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
        SELECT t.tenant, greatest(t.max_running - (
            SELECT count(*) FROM runlane.runs AS x
            WHERE x.tenant = t.tenant AND x.status IN ('running', 'cancel_requested')), 0)
            AS free
        FROM runlane.tenant_limits AS t
        WHERE t.tenant = ANY(locked_caps)
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
