-- Every tenant's page of live runs walks each tenant's newest runs first,
-- as a tenant's page does (0037), while the tenants are few.
--
-- 0037 read every tenant's page of live runs from the partial indexes of
-- pending and leased runs at once, since run_listing has no order across
-- tenants to bound a walk by. Behind a backlog that read the whole
-- backlog: 107-113 ms with 200,000 pending runs, where the newest-first
-- walk of the code before found its page in 1.3-1.7 ms (thirty-first
-- session, `python -m bench.listing --backlog 200000`). Here, when there
-- are at most 16 tenants (found by skipping through run_listing_tenant_idx,
-- one descent each, as list_runs does), each tenant's newest 2 x p_limit
-- runs are walked; when every tenant's walk holds a page of live runs or
-- all of the tenant's runs, the page is the newest of their live runs,
-- exactly. Otherwise, or with more tenants, the partial indexes are read
-- as before. A drained queue then costs the walks (2 x p_limit runs per
-- tenant) before its few live runs are read. Measured after this
-- migration (`python -m bench.listing`, with and without the backlog):
-- every tenant's page of pending runs 1.9 ms behind the backlog, 1.2 ms
-- without it (1.0 ms under 0037).
--
-- The walk of one tenant's runs is a function of its own, used by both.
-- It also fixes 0037's walk past a cursor: 0037 tested the cursor as a
-- filter ("IS NULL OR"), which a generic plan could not use as a bound of
-- the index scan, so a later page walked every run newer than its cursor
-- (a first draft of this migration, which tested it the same way: 6,017
-- rows for the second page of 5 among three tenants' 6,000 runs,
-- tests/integration/test_query_plans.py).
CREATE FUNCTION runlane.walk_live_runs(
    p_statuses text[],
    p_tenant text,
    p_user_id text,
    p_thread_id text,
    p_agent text,
    p_before_created_at timestamptz,
    p_before_id uuid,
    p_limit integer,
    p_walk_limit integer,
    OUT walked integer,
    OUT matched uuid[]
)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET max_parallel_workers_per_gather = 0
SET jit = off
AS $$
BEGIN
    -- matched: the newest p_limit live runs among the p_walk_limit newest
    -- runs of the tenant (or owner) before the cursor; walked: how many
    -- runs the walk saw (fewer than p_walk_limit: all there are). No
    -- cursor is the cursor after every run, so that the cursor is always
    -- a bound of the index scan: as a filter (0037's "IS NULL OR"), a
    -- generic plan walked every run newer than the cursor to reach it
    -- (6,017 rows for the second page of 5 among three tenants' 6,000
    -- runs). Sorts are off so that the walk follows the index's order and
    -- stops at its limit.
    -- One query per index: the owner's walk must count the owner's runs,
    -- which the tenant's index would reach only by filtering.
    IF p_user_id IS NULL THEN
        SELECT count(*),
               (array_agg(r.id ORDER BY newest.created_at DESC, newest.run_id DESC)
                    FILTER (WHERE r.id IS NOT NULL))[1:p_limit]
        INTO walked, matched
        FROM (
            SELECT l.run_id, l.created_at FROM runlane.run_listing AS l
            WHERE l.tenant = p_tenant
              AND (l.created_at, l.run_id)
                  < (coalesce(p_before_created_at, 'infinity'),
                     coalesce(p_before_id, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
            ORDER BY l.created_at DESC, l.run_id DESC
            LIMIT p_walk_limit
        ) AS newest
        LEFT JOIN runlane.runs AS r
          ON r.id = newest.run_id AND r.status = ANY(p_statuses)
         AND (p_thread_id IS NULL OR r.thread_id = p_thread_id)
         AND (p_agent IS NULL OR r.agent = p_agent);
    ELSE
        SELECT count(*),
               (array_agg(r.id ORDER BY newest.created_at DESC, newest.run_id DESC)
                    FILTER (WHERE r.id IS NOT NULL))[1:p_limit]
        INTO walked, matched
        FROM (
            SELECT l.run_id, l.created_at FROM runlane.run_listing AS l
            WHERE l.tenant = p_tenant AND l.user_id = p_user_id
              AND (l.created_at, l.run_id)
                  < (coalesce(p_before_created_at, 'infinity'),
                     coalesce(p_before_id, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
            ORDER BY l.created_at DESC, l.run_id DESC
            LIMIT p_walk_limit
        ) AS newest
        LEFT JOIN runlane.runs AS r
          ON r.id = newest.run_id AND r.status = ANY(p_statuses)
         AND (p_thread_id IS NULL OR r.thread_id = p_thread_id)
         AND (p_agent IS NULL OR r.agent = p_agent);
    END IF;
END;
$$;

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
    -- A tenant's page alone may walk further (10 pages' worth, as in
    -- 0037); each of several tenants walks 2 pages' worth.
    walk_limit integer := CASE WHEN p_tenant IS NOT NULL THEN 10 * p_limit
                               ELSE 2 * p_limit END;
BEGIN
    IF p_tenant IS NOT NULL THEN
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
    END IF;

    IF conclusive THEN
        FOREACH name IN ARRAY coalesce(tenant_names, '{}') LOOP
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
