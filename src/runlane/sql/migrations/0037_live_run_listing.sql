-- A listing of the live statuses (pending, running, cancel_requested) reads
-- the live runs, through their partial indexes, whatever the history and
-- whatever the statistics say.
--
-- list_runs walks a tenant's runs newest first and keeps the statuses asked
-- for; it stops when its page is full. Asked for live runs when few are
-- live, it reads the whole history to find them: no index holds pending
-- and leased runs together, and for pending runs alone the planner walks
-- as soon as its statistics say pending runs are common, which they said
-- after any burst (a queue that has drained is analyzed again only after
-- a tenth of the table changed). Measured before this migration
-- (thirty-first session, `python -m bench history`, BENCHMARKS.md section
-- 4): an operator's page of the live runs, 5 live among 1,000,000 finished
-- runs, took 2.5 s (146 ms among 100,000).
--
-- Here the pending runs and the leased runs are read as two scans, one per
-- partial index (as the queue gauges read them, 0024), each part's newest
-- runs kept by a top-N sort and the two merged: the work grows with the
-- live runs, not the history. Sequential and bitmap scans are off, as in
-- 0024, so that no kept plan reads the table whole; parallel workers too,
-- which a generic plan started even for a part its statuses leave out
-- (4.6 ms for a page of running runs beside 200,000 pending ones, against
-- 0.1 ms without them).
--
-- Read that way alone, a page of one tenant's live runs would cost what
-- every tenant's live runs are: behind a backlog of 200,000 pending runs
-- over three tenants, 62 ms for one tenant's page (measured before the
-- walk below was added), where list_runs' walk of the tenant's own runs
-- took 1.1 ms.
-- So with a tenant given, the walk comes first, bounded: the tenant's (or
-- the owner's) newest 10 x p_limit runs. When they hold a page of live
-- runs, or are all the runs there are, they answer exactly (any run not
-- among them is older than all of them); only otherwise are the partial
-- indexes read. A tenant's own backlog is then found at the top of its
-- walk, and a drained queue costs the bounded walk and its few live runs.
-- Every tenant's page has no walk to bound (run_listing has no order
-- across tenants): behind a backlog it reads all of it (107-113 ms with
-- 200,000 pending, where list_runs' walk found its page among the newest
-- in 1.3-1.7 ms; `python -m bench.listing --backlog 200000`). A backlog that large is a state the queue works its way
-- out of; a history is kept.
CREATE FUNCTION runlane.list_live_runs(
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
    walk_limit integer := 10 * p_limit;
    walked integer;
    matched uuid[];
BEGIN
    IF p_tenant IS NOT NULL THEN
        IF p_user_id IS NULL THEN
            SELECT count(*),
                   (array_agg(r.id ORDER BY newest.created_at DESC, newest.run_id DESC)
                        FILTER (WHERE r.id IS NOT NULL))[1:p_limit]
            INTO walked, matched
            FROM (
                SELECT l.run_id, l.created_at FROM runlane.run_listing AS l
                WHERE l.tenant = p_tenant
                  AND (p_before_created_at IS NULL
                       OR (l.created_at, l.run_id) < (p_before_created_at, p_before_id))
                ORDER BY l.created_at DESC, l.run_id DESC
                LIMIT walk_limit
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
                  AND (p_before_created_at IS NULL
                       OR (l.created_at, l.run_id) < (p_before_created_at, p_before_id))
                ORDER BY l.created_at DESC, l.run_id DESC
                LIMIT walk_limit
            ) AS newest
            LEFT JOIN runlane.runs AS r
              ON r.id = newest.run_id AND r.status = ANY(p_statuses)
             AND (p_thread_id IS NULL OR r.thread_id = p_thread_id)
             AND (p_agent IS NULL OR r.agent = p_agent);
        END IF;
        -- matched holds the newest p_limit of the live runs walked.
        IF walked < walk_limit OR cardinality(matched) >= p_limit THEN
            RETURN QUERY
            SELECT r.* FROM runlane.runs AS r
            WHERE r.id = ANY(matched)
            ORDER BY r.created_at DESC, r.id DESC
            LIMIT p_limit;
            RETURN;
        END IF;
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
