-- The capped claim (used while any tenant has a cap) fires its attempts'
-- foreign-key checks under pinned settings, as the uncapped claim does
-- since 0016.
--
-- Left to the commit, the checks run under the session's settings, where
-- PostgreSQL keeps one plan for them per session, made from the
-- statistics of that moment: made while runs was small, that plan is a
-- sequential scan of runs, kept as the table grows (0016 tells the trap:
-- 3 ms per claimed run once runs held 30,000 rows). The capped claim
-- cannot fire them itself: under its force_custom_plan each check would
-- be planned again for every claimed run (why 0010 deferred them).
--
-- runlane.check_claimed_attempts fires them (SET CONSTRAINTS ...
-- IMMEDIATE, then DEFERRED again for the rest of the transaction) under
-- settings that pin the kept plan to the primary-key lookup. claim_runs
-- calls it after a capped claim only, so the uncapped path pays nothing
-- (a call on every claim measured slower in the lane relay: 0016's
-- header).
--
-- CREATE OR REPLACE: a first form of 0016, on main for an hour of
-- 2026-11-30 (d7f9cda), created a function of this name and called it
-- after both claims. A database migrated then keeps that 0016 (the
-- migrator records versions, not contents): there the uncapped claim
-- leaves its check to the commit again after this migration, as before
-- 0016 (a slower plan, not a wrong result).
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
        PERFORM runlane.check_claimed_attempts();
    ELSE
        RETURN QUERY SELECT * FROM runlane.claim_uncapped_runs(
            p_worker_id, p_agents, p_limit, p_lease_seconds, p_aging_seconds);
    END IF;
END;
$$;
