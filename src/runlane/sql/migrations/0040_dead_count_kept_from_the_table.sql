-- The dead letter's count reads the partial index of dead runs, whatever
-- the statistics say.
--
-- Every worker with a metrics port counts the dead runs every 5 s, and the
-- dashboard's overview (GET /v1/admin/overview) on each refresh. As a
-- plain statement, prepared on a long-lived connection, the count was
-- planned from the statistics at hand: taken after a burst of failures
-- (runs sent to the dead letter, then re-queued and finished), they made
-- it a sequential scan of runs, every poll, until the next ANALYZE. In a
-- test, 3,000 dead runs analyzed and then completed, 2 dead after them:
-- 21 counts read 63,042 rows in 21 scans; here 42 rows, the dead ones
-- (tests/integration/test_query_plans.py). As the queue gauges (0024),
-- the count runs inside a function with sequential scans off.
CREATE FUNCTION runlane.dead_count(p_tenant text)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN (SELECT count(*) FROM runlane.runs AS r
            WHERE r.status = 'dead' AND (p_tenant IS NULL OR r.tenant = p_tenant));
END;
$$;
