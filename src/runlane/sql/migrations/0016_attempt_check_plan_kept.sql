-- The claim's foreign-key check on run_attempts runs inside a function
-- whose plans are pinned to the primary key, at the end of every claim.
--
-- Since 0010 the check (one lookup of runs per claimed run) waited for the
-- commit and ran under the session's settings, where PostgreSQL keeps one
-- plan for it per session, made from the statistics of that moment. Made
-- while runs was analyzed with a few dozen rows, that plan is a
-- sequential scan (cheaper than the index on such a table), and it stayed
-- in use as the table grew, until the next ANALYZE: each claimed run's
-- check then read runs up to the run's new row version, which an update
-- puts near the end of the table (3 ms per claimed run with 30,000 runs
-- stored; tests/integration/test_query_plans.py).
--
-- runlane.check_claimed_attempts fires the waiting checks at once (SET
-- CONSTRAINTS ... IMMEDIATE), under settings that keep one plan per
-- session with sequential and bitmap scans off, so the plan it keeps is
-- the primary-key lookup; it then defers the constraint again for the rest
-- of the transaction. claim_runs calls it after either claim path, so the
-- capped claim's force_custom_plan does not reach the check either (the
-- reason 0010 deferred it).
CREATE OR REPLACE FUNCTION runlane.check_claimed_attempts() RETURNS void
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    SET CONSTRAINTS runlane.run_attempts_run_id_fkey IMMEDIATE;
    SET CONSTRAINTS runlane.run_attempts_run_id_fkey DEFERRED;
END;
$$;

CREATE OR REPLACE FUNCTION runlane.claim_runs(
    p_worker_id text,
    p_agents text[],
    p_limit integer,
    p_lease_seconds double precision,
    p_aging_seconds double precision
) RETURNS SETOF runlane.runs
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM runlane.tenant_limits) THEN
        RETURN QUERY SELECT * FROM runlane.claim_capped_runs(
            p_worker_id, p_agents, p_limit, p_lease_seconds, p_aging_seconds);
    ELSE
        RETURN QUERY SELECT * FROM runlane.claim_uncapped_runs(
            p_worker_id, p_agents, p_limit, p_lease_seconds, p_aging_seconds);
    END IF;
    PERFORM runlane.check_claimed_attempts();
END;
$$;
