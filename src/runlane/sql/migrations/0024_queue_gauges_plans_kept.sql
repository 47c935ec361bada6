-- The live-queue gauges and the waiting-lanes list keep plans pinned to
-- their partial indexes.
--
-- A worker with a metrics port reads the queue gauges every 5 s on a
-- connection of its pool that lives as long as the worker; the dashboard
-- polls the same gauges and the waiting lanes through the API's
-- connections. As prepared statements they could keep one plan for the
-- connection, made from the statistics of that moment: made while runs
-- and lanes were small, that plan reads them whole. Measured with plans
-- kept from empty tables: the gauges of every tenant read all 20,005 runs
-- (20,000 finished, 5 pending) per refresh, the waiting lanes all 5,000
-- lanes; the work should grow with the live runs and the waiting lanes,
-- never with the history (tests/integration/test_query_plans.py).
--
-- The gauges read the pending runs and the leased runs as two scans, one
-- per partial index (runs_pending_age_idx's predicate, runs_leased_idx's),
-- instead of one scan with an OR of both predicates: an OR can be served
-- by both indexes only through a bitmap scan, and bitmap scans are off in
-- here with sequential scans, as in the run writes of 0019, so that no
-- kept plan reads a table whole. Results and their types are those of the
-- statements they replace (queries.sql).
CREATE FUNCTION runlane.queue_gauges(p_tenant text)
RETURNS TABLE (status text, agent text, tenant text, count bigint,
               oldest_pending_seconds numeric)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT live.status, live.agent, live.tenant, count(*),
           extract(epoch FROM now() - min(live.available_at)
                                      FILTER (WHERE live.status = 'pending'))
    FROM (
        SELECT r.status, r.agent, r.tenant, r.available_at FROM runlane.runs AS r
        WHERE r.status = 'pending' AND (p_tenant IS NULL OR r.tenant = p_tenant)
        UNION ALL
        SELECT r.status, r.agent, r.tenant, r.available_at FROM runlane.runs AS r
        WHERE r.status IN ('running', 'cancel_requested')
          AND (p_tenant IS NULL OR r.tenant = p_tenant)
    ) AS live
    GROUP BY live.status, live.agent, live.tenant
    ORDER BY live.status, live.agent, live.tenant;
END;
$$;

CREATE FUNCTION runlane.waiting_lanes(p_tenant text, p_limit integer)
RETURNS TABLE (tenant text, user_id text, agent text, thread_id text, paused_reason text,
               paused_run_id uuid, interrupted_run_id uuid, queued bigint)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT l.tenant, l.user_id, l.agent, l.thread_id, l.paused_reason, l.paused_run_id,
           l.interrupted_run_id,
           (SELECT count(*) FROM runlane.requests AS q
            WHERE q.lane_id = l.id AND q.status = 'queued')
    FROM runlane.lanes AS l
    WHERE (l.paused_run_id IS NOT NULL OR l.interrupted_run_id IS NOT NULL)
      AND (p_tenant IS NULL OR l.tenant = p_tenant)
    ORDER BY l.updated_at
    LIMIT p_limit;
END;
$$;
