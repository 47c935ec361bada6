-- The workers' list finds each worker's runs, and the pruner its ended
-- requests, through their partial indexes whatever the statistics say.
--
-- list_workers (queries.sql: `runlane workers`, `runlane status`, the
-- dashboard's overview on each refresh) collected each worker's leased
-- runs in a subquery planned from the statistics at hand. Taken during a
-- burst, when most runs were leased by one worker, they made it a
-- sequential scan of runs per worker listed, until the next ANALYZE
-- (tests/integration/test_query_plans.py: 7 listings of two workers after
-- a burst of 3,000 runs read 42,028 rows in 14 scans).
--
-- prune_requests (the pruner, every pass) looked for ended requests the
-- same way: after a burst of rejected requests was analyzed, the search
-- read the whole requests table at every pass, and that table keeps every
-- dispatched request as long as its run (7 passes: 24,006 rows in 10
-- scans).
--
-- Both searches are functions now, with sequential scans off, as the dead
-- letter's count (0040) and the reaper's search (0041).
CREATE FUNCTION runlane.worker_run_ids(p_worker_id text)
RETURNS uuid[]
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN coalesce((SELECT array_agg(r.id ORDER BY r.started_at) FROM runlane.runs AS r
                     WHERE r.worker_id = p_worker_id
                       AND r.status IN ('running', 'cancel_requested')),
                    '{}');
END;
$$;

-- Requests that ended without a run (cancelled, rejected, failed) and
-- dispatched ones whose run was pruned, older than the retention; locked
-- as the pruner's statement locked them (FOR UPDATE SKIP LOCKED).
CREATE FUNCTION runlane.prunable_requests(p_older_than_seconds double precision,
                                          p_limit integer)
RETURNS SETOF uuid
LANGUAGE plpgsql
-- A pass deletes at most a batch: estimated at the default 1,000 rows, the
-- DELETE could join them to requests by reading the table whole.
ROWS 500
SET enable_seqscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT q.id FROM runlane.requests AS q
    WHERE (q.status IN ('cancelled', 'rejected', 'failed')
           AND q.ended_at < now() - make_interval(secs => p_older_than_seconds))
       OR (q.status = 'dispatched' AND q.run_id IS NULL
           AND q.dispatched_at < now() - make_interval(secs => p_older_than_seconds))
    LIMIT p_limit
    FOR UPDATE OF q SKIP LOCKED;
END;
$$;
