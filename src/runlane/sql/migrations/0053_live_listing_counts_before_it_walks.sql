-- An operator's page of live runs skips the walk of the newest runs when
-- fewer runs are live than a page.
--
-- list_live_runs (0037, 0042, 0044) walks the newest runs, ten pages'
-- worth, before it reads the live runs' partial indexes, so that a page
-- behind a backlog of pending runs is found at the top of the walk. When
-- few runs are live the walk finds less than a page and the partial
-- indexes are read anyway: the walk, 500 runs looked up for a page of 50,
-- was most of the page's cost, and it grew with the history (the
-- forty-second session's `python -m bench history`: 1.57, 1.77 and 2.02
-- ms p50 for five live runs among 0, 100,000 and 1,000,000 finished runs;
-- BENCHMARKS.md section 4). The live runs are now counted first, up to a
-- page of each kind, through the same partial indexes (a plan kept from
-- this function's settings cannot read the table instead); fewer than a
-- page are read directly. The answer is the same either way: the partial
-- indexes' query is the exact one, the walk only a shortcut to it.
CREATE OR REPLACE FUNCTION runlane.list_live_runs(
    p_statuses text[],
    p_tenant text,
    p_user_id text,
    p_thread_id text,
    p_agent text,
    p_before_created_at timestamptz,
    p_before_id uuid,
    p_limit integer
) RETURNS SETOF runlane.runs
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET max_parallel_workers_per_gather = 0
SET jit = off
AS $$
DECLARE
    tenant_names text[];
    name text;
    walk record;
    found uuid[] := '{}';
    conclusive boolean := true;
    -- One walk (a tenant's, or every tenant's) may go 10 pages' worth, as
    -- in 0037; each of several tenants' walks 2 pages' worth.
    walk_limit integer := CASE WHEN p_tenant IS NOT NULL OR p_user_id IS NULL
                               THEN 10 * p_limit ELSE 2 * p_limit END;
    few_live boolean;
BEGIN
    -- Fewer live runs of these statuses than a page, whatever their
    -- tenant: the partial indexes below hold the answer for less than any
    -- walk costs. Counted up to a page of each kind, so that behind a
    -- backlog the count stops early and the walk follows as before. The
    -- pending runs are counted newest first: while a backlog drains, the
    -- oldest entries of the pending indexes belong to runs already claimed
    -- until vacuum, and the newest are the backlog's own.
    SELECT (SELECT count(*) FROM (
                SELECT FROM runlane.runs AS r
                WHERE r.status = 'pending' AND 'pending' = ANY(p_statuses)
                ORDER BY r.available_at DESC, r.seq DESC
                LIMIT p_limit) AS pending)
         + (SELECT count(*) FROM (
                SELECT FROM runlane.runs AS r
                WHERE r.status IN ('running', 'cancel_requested') AND r.status = ANY(p_statuses)
                LIMIT p_limit) AS leased)
           < p_limit
    INTO few_live;
    IF few_live THEN
        conclusive := false;  -- no walk: the partial indexes' query below
    ELSIF p_tenant IS NOT NULL OR p_user_id IS NULL THEN
        -- p_tenant NULL here: every tenant's runs in one walk.
        tenant_names := ARRAY[p_tenant];
    ELSE
        WITH RECURSIVE tenants AS (
            (SELECT l.tenant FROM runlane.run_listing AS l ORDER BY l.tenant LIMIT 1)
            UNION ALL
            SELECT (SELECT l.tenant FROM runlane.run_listing AS l
                    WHERE l.tenant > t.tenant ORDER BY l.tenant LIMIT 1)
            FROM tenants AS t
            WHERE t.tenant IS NOT NULL
        )
        SELECT array_agg(few.tenant) INTO tenant_names
        FROM (SELECT t.tenant FROM tenants AS t WHERE t.tenant IS NOT NULL LIMIT 17) AS few;
        conclusive := coalesce(cardinality(tenant_names), 0) <= 16;
        tenant_names := coalesce(tenant_names, '{}');
    END IF;

    IF conclusive THEN
        FOREACH name IN ARRAY tenant_names LOOP
            walk := runlane.walk_live_runs(
                p_statuses, name, p_user_id, p_thread_id, p_agent, p_before_created_at,
                p_before_id, p_limit, walk_limit);
            IF walk.walked < walk_limit OR coalesce(cardinality(walk.matched), 0) >= p_limit THEN
                found := found || coalesce(walk.matched, '{}');
            ELSE
                conclusive := false;
                EXIT;
            END IF;
        END LOOP;
    END IF;

    IF conclusive THEN
        RETURN QUERY
        SELECT r.* FROM runlane.runs AS r
        WHERE r.id = ANY(found)
        ORDER BY r.created_at DESC, r.id DESC
        LIMIT p_limit;
        RETURN;
    END IF;

    RETURN QUERY
    SELECT live.* FROM (
        (SELECT r.* FROM runlane.runs AS r
         WHERE r.status = 'pending' AND 'pending' = ANY(p_statuses)
           AND (p_tenant IS NULL OR r.tenant = p_tenant)
           AND (p_user_id IS NULL OR r.user_id = p_user_id)
           AND (p_thread_id IS NULL OR r.thread_id = p_thread_id)
           AND (p_agent IS NULL OR r.agent = p_agent)
           AND (p_before_created_at IS NULL
                OR (r.created_at, r.id) < (p_before_created_at, p_before_id))
         ORDER BY r.created_at DESC, r.id DESC
         LIMIT p_limit)
        UNION ALL
        (SELECT r.* FROM runlane.runs AS r
         WHERE r.status IN ('running', 'cancel_requested') AND r.status = ANY(p_statuses)
           AND (p_tenant IS NULL OR r.tenant = p_tenant)
           AND (p_user_id IS NULL OR r.user_id = p_user_id)
           AND (p_thread_id IS NULL OR r.thread_id = p_thread_id)
           AND (p_agent IS NULL OR r.agent = p_agent)
           AND (p_before_created_at IS NULL
                OR (r.created_at, r.id) < (p_before_created_at, p_before_id))
         ORDER BY r.created_at DESC, r.id DESC
         LIMIT p_limit)
    ) AS live
    ORDER BY live.created_at DESC, live.id DESC
    LIMIT p_limit;
END;
$$;
