-- The reaper finds the expired leases of direct runs through the partial
-- index of leased runs, whatever the statistics say.
--
-- reap_expired_leases (queries.sql) runs every reaper interval (10 s by
-- default) as a statement prepared on the reaper's long-lived connection.
-- Its search for expired leases was planned from the statistics at hand:
-- taken during a burst, when most runs were leased, they made it a
-- sequential scan of runs and a sort, at every pass until the next
-- ANALYZE (tests/integration/test_query_plans.py: 7 passes after a burst
-- of 3,000 runs read 21,016 rows in 7 scans; 4 rows with this). The
-- search is this function now, with sequential scans off, as the run
-- writes (0019) and the queue gauges (0024); it locks what it returns, as
-- the statement's own search did (FOR UPDATE SKIP LOCKED, oldest expiry
-- first).
CREATE FUNCTION runlane.expired_direct_leases(p_limit integer)
RETURNS TABLE (id uuid, lease_token uuid, claim_count integer, worker_id text,
               attempt_started_at timestamptz)
LANGUAGE plpgsql
-- A pass finds a few expired leases, if any: estimated at the default
-- 1,000 rows, the statement's UPDATE joined them to runs by reading the
-- table whole (a hash join) instead of by primary key.
ROWS 10
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT r.id, r.lease_token, r.claim_count, r.worker_id, r.attempt_started_at
    FROM runlane.runs AS r
    WHERE r.status IN ('running', 'cancel_requested') AND r.lease_expires_at < now()
      AND r.lane_id IS NULL
    ORDER BY r.lease_expires_at
    LIMIT p_limit
    FOR UPDATE OF r SKIP LOCKED;
END;
$$;
