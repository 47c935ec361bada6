-- The tenant caps' listing counts each capped tenant's running runs through
-- the partial index of leased runs, whatever the statistics say.
--
-- `runlane tenants list`, `runlane status` and GET /v1/admin/tenant list
-- the caps with each tenant's running runs (list_tenant_limits). As a
-- plain statement, that count was planned from the statistics at hand:
-- taken during a burst, when most runs were running, they made it a
-- sequential scan of runs per capped tenant, the same trap as the capped
-- claim's count (0038): after a burst of 3,000 runs, the caps of two
-- tenants listed for both and for one read 9,060 rows in three scans;
-- 6 rows here (tests/integration/test_query_plans.py). It runs inside a
-- function with sequential scans off, as the queue gauges do (0024).
CREATE FUNCTION runlane.tenant_caps(p_tenant text)
RETURNS TABLE (tenant text, max_running integer, running bigint)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT l.tenant, l.max_running,
           (SELECT count(*) FROM runlane.runs AS r
            WHERE r.tenant = l.tenant AND r.status IN ('running', 'cancel_requested'))
    FROM runlane.tenant_limits AS l
    WHERE p_tenant IS NULL OR l.tenant = p_tenant
    ORDER BY l.tenant;
END;
$$;
