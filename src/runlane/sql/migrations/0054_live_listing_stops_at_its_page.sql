-- An operator's page of live runs reads no more than its page needs: the
-- walk of the newest runs stops at the page's last run, and the leased
-- runs are counted only when the pending runs do not fill a page.
--
-- walk_live_runs (0042, 0044) looked up its whole walk, ten pages' worth
-- (500 runs for a page of 50), even when the page was found among the
-- first runs, as behind a backlog of pending runs, where the newest runs
-- are the page. It now keeps the walk's matches in the walk's order under
-- a LIMIT of a page, so that the nested loop over the newest runs stops
-- at the page's last run. The run at the walk's limit is kept beside the
-- matches, so that `walked`, now the position of the last run kept rather
-- than a count of the runs seen, reaches p_walk_limit only when the walk
-- did; list_live_runs reads the answer as before: conclusive when the
-- walk ended before its limit or holds a page. (A window's running count
-- of the matches under a condition, which PostgreSQL 15 can stop early,
-- would stop only at the next match after the page.)
--
-- list_live_runs (0053) counted the pending and the leased runs, each up
-- to a page, before it chose between the walk and the partial indexes.
-- While a backlog drains, the leased runs' index holds the entries of
-- the runs already claimed and ended until vacuum, and the count met them
-- (the first page after 150,000 of 200,000 pending runs were claimed and
-- completed, unvacuumed: 56.8-61.7 ms with 0053, 10.8-14.3 ms with 0054,
-- about what a first call costs without the drain; `python -m
-- bench.listing --drained`, BENCHMARKS.md section 4). With a page of
-- pending runs there is nothing for the leased count to decide: it is
-- now made only when the pending runs are fewer than a page, and only up
-- to what the page still lacks.
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
    -- walk follows the index's order, and there is one query per index.
    -- The matches and the walk's last run (n = p_walk_limit), a page of
    -- them at most, in the walk's order: the nested loop over the newest
    -- runs ends at the page's last run or at the walk's.
    IF p_tenant IS NULL THEN
        IF p_user_id IS NOT NULL THEN
            RAISE EXCEPTION 'walk_live_runs: an owner''s walk needs its tenant';
        END IF;
        SELECT coalesce(max(w.n), 0), array_agg(w.id ORDER BY w.n) FILTER (WHERE w.id IS NOT NULL)
        INTO walked, matched
        FROM (
            SELECT newest.n, r.id
            FROM (
                SELECT l.run_id, l.created_at,
                       row_number() OVER (ORDER BY l.created_at DESC, l.run_id DESC) AS n
                FROM runlane.run_listing AS l
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
             AND (p_agent IS NULL OR r.agent = p_agent)
            WHERE r.id IS NOT NULL OR newest.n = p_walk_limit
            ORDER BY newest.created_at DESC, newest.run_id DESC
            LIMIT p_limit
        ) AS w;
    ELSIF p_user_id IS NULL THEN
        SELECT coalesce(max(w.n), 0), array_agg(w.id ORDER BY w.n) FILTER (WHERE w.id IS NOT NULL)
        INTO walked, matched
        FROM (
            SELECT newest.n, r.id
            FROM (
                SELECT l.run_id, l.created_at,
                       row_number() OVER (ORDER BY l.created_at DESC, l.run_id DESC) AS n
                FROM runlane.run_listing AS l
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
             AND (p_agent IS NULL OR r.agent = p_agent)
            WHERE r.id IS NOT NULL OR newest.n = p_walk_limit
            ORDER BY newest.created_at DESC, newest.run_id DESC
            LIMIT p_limit
        ) AS w;
    ELSE
        SELECT coalesce(max(w.n), 0), array_agg(w.id ORDER BY w.n) FILTER (WHERE w.id IS NOT NULL)
        INTO walked, matched
        FROM (
            SELECT newest.n, r.id
            FROM (
                SELECT l.run_id, l.created_at,
                       row_number() OVER (ORDER BY l.created_at DESC, l.run_id DESC) AS n
                FROM runlane.run_listing AS l
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
             AND (p_agent IS NULL OR r.agent = p_agent)
            WHERE r.id IS NOT NULL OR newest.n = p_walk_limit
            ORDER BY newest.created_at DESC, newest.run_id DESC
            LIMIT p_limit
        ) AS w;
    END IF;
END;
$$;

-- list_live_runs as in 0053, but for its count of the live runs.
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
    live_counted integer := 0;
BEGIN
    -- Fewer live runs of these statuses than a page, whatever their
    -- tenant: the partial indexes below hold the answer for less than any
    -- walk costs (0053). The pending runs are counted first, up to a page,
    -- newest first: while a backlog drains, the oldest entries of the
    -- pending indexes belong to runs already claimed until vacuum, and the
    -- newest are the backlog's own. The leased runs only for what the page
    -- still lacks: their index then holds the entries of the drained runs.
    IF 'pending' = ANY(p_statuses) THEN
        SELECT count(*) INTO live_counted FROM (
            SELECT FROM runlane.runs AS r
            WHERE r.status = 'pending'
            ORDER BY r.available_at DESC, r.seq DESC
            LIMIT p_limit) AS pending;
    END IF;
    IF live_counted < p_limit THEN
        SELECT live_counted + count(*) INTO live_counted FROM (
            SELECT FROM runlane.runs AS r
            WHERE r.status IN ('running', 'cancel_requested') AND r.status = ANY(p_statuses)
            LIMIT p_limit - live_counted) AS leased;
    END IF;
    IF live_counted < p_limit THEN
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
