-- The recovery pass's two scans keep plans pinned to their indexes.
--
-- Every worker runs the lane recovery pass (runlane.lane_store, recover)
-- every reaper interval, one at a time under an advisory lock, on a
-- connection of its pool that lives as long as the worker. Its two scans
-- were prepared statements: after five passes PostgreSQL may keep one plan
-- for the connection, made from the statistics of that moment. Made while
-- the tables were small, that plan can read them whole: with 5,000 lanes,
-- 20,000 requests and 20,000 runs, finding the three lanes that needed a
-- dispatch read every request and every run three times over (80,003 rows
-- per pass; another kept plan read every lane instead), and finding
-- expired interrupts read every run (20,000), every ten seconds, growing
-- with the history (measured with a script; the test in
-- tests/integration/test_query_plans.py reads 3,030 rows for one pass
-- beside 3,000 lanes without this migration, 33 with it).
--
-- Here each scan runs inside a function whose plan is kept for the session
-- (force_generic_plan) with the plan shapes that read a table whole turned
-- off (sequential and bitmap scans, hash and merge joins), as the run
-- writes of 0019 and the intake of 0022: what is left is the partial
-- indexes the scans were written for (queued requests, a lane's active
-- run, interrupted runs by expiry) and primary-key lookups. The results
-- are those of the statements they replace (lanes.sql).
CREATE FUNCTION runlane.lanes_needing_dispatch(p_limit integer)
RETURNS TABLE (lane_id bigint)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT DISTINCT q.lane_id FROM runlane.requests AS q
    WHERE q.status = 'queued'
      AND NOT EXISTS (
          SELECT 1 FROM runlane.runs AS r
          WHERE r.lane_id = q.lane_id AND r.status IN ('pending', 'running', 'cancel_requested'))
      AND EXISTS (
          SELECT 1 FROM runlane.lanes AS l
          WHERE l.id = q.lane_id AND l.paused_run_id IS NULL AND l.interrupted_run_id IS NULL)
    LIMIT p_limit;
END;
$$;

CREATE FUNCTION runlane.expired_interrupts(p_limit integer)
RETURNS TABLE (id uuid, lane_id bigint)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT r.id, r.lane_id FROM runlane.runs AS r
    WHERE r.status = 'interrupted' AND r.interrupt_expires_at < now()
    ORDER BY r.interrupt_expires_at
    LIMIT p_limit;
END;
$$;
