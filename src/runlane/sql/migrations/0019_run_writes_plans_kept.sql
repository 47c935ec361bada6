-- The writes a running attempt makes (event append, checkpoint, turn
-- count, effect record and lookup) keep plans pinned to primary-key
-- lookups, whatever the statistics were when they were made.
--
-- They were plain statements, which psycopg prepares at their sixth run on
-- a connection; PostgreSQL then keeps one plan for each (and for the
-- foreign-key checks of the rows they insert) once it finds that plan no
-- dearer than planning each call. On a table of a page, where reading it
-- whole is cheapest, the plan kept read runs (and run_effects) whole and
-- kept doing so as they grew, until the next ANALYZE: 30,000 rows read per
-- event appended on a worker connection that started on a small table
-- (tests/integration/test_query_plans.py). An agent streaming tokens
-- appends an event per token.
--
-- Each write is now a plpgsql function with the settings of the claim and
-- the outcome write (0012, 0015): plans kept for the session
-- (force_generic_plan) with sequential and bitmap scans off, so the only
-- plan left finds the row by its primary key. The foreign-key checks of
-- run_events and run_effects fire inside, at the end of the insert, under
-- the same settings. Semantics are those of the statements they replace
-- (queries.sql): fenced by lease token; no row (or NULL) when the lease is
-- not held.
CREATE FUNCTION runlane.append_event(
    p_run_id uuid, p_lease_token uuid, p_kind text, p_data jsonb
) RETURNS bigint
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
DECLARE
    new_seq bigint;
BEGIN
    -- The per-run seq lives on the run row, bumped in the statement that
    -- checks the lease token: gap-free.
    WITH bumped AS (
        UPDATE runlane.runs
        SET last_event_seq = last_event_seq + 1
        WHERE id = p_run_id AND lease_token = p_lease_token
        RETURNING id, last_event_seq, claim_count
    )
    INSERT INTO runlane.run_events (run_id, seq, kind, data, attempt)
    SELECT id, last_event_seq, p_kind, p_data, claim_count FROM bumped
    RETURNING seq INTO new_seq;
    RETURN new_seq;
END;
$$;

CREATE FUNCTION runlane.save_checkpoint(
    p_run_id uuid, p_lease_token uuid, p_checkpoint jsonb
) RETURNS boolean
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    UPDATE runlane.runs SET checkpoint = p_checkpoint
    WHERE id = p_run_id AND lease_token = p_lease_token;
    RETURN FOUND;
END;
$$;

CREATE FUNCTION runlane.count_turn(p_run_id uuid, p_lease_token uuid) RETURNS integer
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
DECLARE
    new_count integer;
BEGIN
    UPDATE runlane.runs SET turns = turns + 1
    WHERE id = p_run_id AND lease_token = p_lease_token
    RETURNING turns INTO new_count;
    RETURN new_count;
END;
$$;

CREATE FUNCTION runlane.get_effect(p_run_id uuid, p_key text)
RETURNS TABLE (result jsonb)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT e.result FROM runlane.run_effects AS e WHERE e.run_id = p_run_id AND e.key = p_key;
END;
$$;

CREATE FUNCTION runlane.record_effect(
    p_run_id uuid, p_lease_token uuid, p_key text, p_result jsonb
) RETURNS TABLE (owned bigint, result jsonb)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    -- Recorded only while the lease is held. An existing record for the
    -- same key wins: DO UPDATE (a no-op) returns it even when it was
    -- committed while this statement waited.
    RETURN QUERY
    WITH owner AS (
        SELECT r.id, r.claim_count FROM runlane.runs AS r
        WHERE r.id = p_run_id AND r.lease_token = p_lease_token
        FOR SHARE
    ), inserted AS (
        INSERT INTO runlane.run_effects AS e (run_id, key, result, attempt)
        SELECT owner.id, p_key, p_result, owner.claim_count FROM owner
        ON CONFLICT (run_id, key) DO UPDATE SET result = e.result
        RETURNING e.result
    )
    SELECT (SELECT count(*) FROM owner), (SELECT inserted.result FROM inserted);
END;
$$;
