-- An operator's listing (no tenant given) walks every tenant's runs newest
-- first through one index, whatever the number of tenants.
--
-- run_listing had no order across tenants, so a listing without a tenant
-- was put together from one page per tenant, each found by skipping
-- through run_listing_tenant_idx (list_runs), and the live statuses' walk
-- of 0042 was made for at most 16 tenants: with more, it read the live
-- runs' partial indexes, which behind a backlog meant every pending run
-- (107-113 ms with 200,000 pending; thirty-first session). A page for
-- every tenant cost a page of each: 1,000 tenants, 1,000 pages read for
-- one shown (`python -m bench.listing --tenants 1000`, BENCHMARKS.md
-- section 4).
--
-- With this index a listing without a tenant or an owner walks every
-- run newest first and stops at its page. The entry is written once, at
-- the insert (run_listing is written once per run, 0030), and it goes to
-- the index's right edge: no claim or outcome write touches it.
--
-- It is partial, its predicate true of every run, so that only a query
-- that states the predicate can use it. Otherwise a tenant's walk, whose
-- order it also gives, may take it and filter by tenant: a generic plan
-- expects each tenant to hold an even share of the runs and found the
-- walk of every run, filtered, cheaper than the tenant's index (the walk
-- of one of three tenants' runs read 148 entries for a page of 5;
-- tests/integration/test_query_plans.py). A tenant with few runs among
-- millions would then walk them all. (A run created at '-infinity', which
-- no submit makes, would be left out of every tenant's listing.)
CREATE INDEX run_listing_created_idx ON runlane.run_listing (created_at DESC, run_id DESC)
    WHERE created_at > '-infinity';

-- walk_live_runs (0042) with p_tenant NULL: every tenant's newest runs, by
-- the new index (only without an owner, which run_listing_owner_idx
-- serves tenant by tenant).
CREATE OR REPLACE FUNCTION runlane.walk_live_runs(
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
    -- As in 0042: the cursor is always a bound of the index scan (no
    -- cursor is the cursor after every run), sorts are off so that the
    -- walk follows the index's order and stops at its limit, and there is
    -- one query per index.
    IF p_tenant IS NULL THEN
        IF p_user_id IS NOT NULL THEN
            RAISE EXCEPTION 'walk_live_runs: an owner''s walk needs its tenant';
        END IF;
        SELECT count(*),
               (array_agg(r.id ORDER BY newest.created_at DESC, newest.run_id DESC)
                    FILTER (WHERE r.id IS NOT NULL))[1:p_limit]
        INTO walked, matched
        FROM (
            SELECT l.run_id, l.created_at FROM runlane.run_listing AS l
            WHERE l.created_at > '-infinity'  -- run_listing_created_idx's predicate
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
    ELSIF p_user_id IS NULL THEN
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

-- list_live_runs (0042): without a tenant or an owner, one walk of every
-- tenant's newest runs (10 pages' worth, as a tenant's own page walks)
-- instead of one walk per tenant for at most 16 tenants. An owner's page
-- without a tenant still walks each tenant's runs of that owner, while
-- the tenants are few. When the walk is inconclusive (it ended before all
-- runs and found less than a page), the partial indexes are read as
-- before.
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
BEGIN
    IF p_tenant IS NOT NULL OR p_user_id IS NULL THEN
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
