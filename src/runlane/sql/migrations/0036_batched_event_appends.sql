-- Events of many runs appended in one statement.
--
-- A handler that streams tokens calls ctx.emit once per token, and each
-- call was its own transaction: an update of the run's row (its event
-- seq), an insert into run_events and a commit, on a connection of its
-- own. Fifty runs streaming at once meant fifty backends committing one
-- event each, on the same cores as the worker. A worker now gathers the
-- events its runs emit while a batch is being written and appends them
-- with this function, in one transaction: each run's row is updated once
-- per batch (by the number of its events in it), whatever that number.
--
-- The contract of one append is unchanged: an event is fenced by its
-- attempt's lease token (a stale token appends nothing, and its seq comes
-- back NULL), and each run's seq stays gap-free and increasing, in the
-- order the events are given. The NOTIFY that wakes the run's stream
-- subscribers fires per row, as before; PostgreSQL folds the same
-- notification sent twice in one transaction into one.
--
-- The runs are locked in id order, as finish_attempts locks them, so two
-- batches (or a batch and an outcome write) never wait on each other in a
-- cycle. Row access is pinned to primary-key lookups (the settings below,
-- as in migration 0019).
CREATE FUNCTION runlane.append_events(
    p_run_ids uuid[], p_lease_tokens uuid[], p_kinds text[], p_datas jsonb[]
) RETURNS TABLE (event_ord bigint, event_seq bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH given AS MATERIALIZED (
        SELECT g.ord, g.run_id, g.lease_token, g.kind, g.data,
               row_number() OVER (PARTITION BY g.run_id, g.lease_token ORDER BY g.ord) AS nth
        FROM unnest(p_run_ids, p_lease_tokens, p_kinds, p_datas) WITH ORDINALITY
            AS g(run_id, lease_token, kind, data, ord)
    ), per_run AS MATERIALIZED (
        SELECT given.run_id, given.lease_token, count(*) AS events
        FROM given
        GROUP BY given.run_id, given.lease_token
    ), target AS MATERIALIZED (
        SELECT r.id, per_run.lease_token, per_run.events
        FROM per_run JOIN runlane.runs AS r ON r.id = per_run.run_id
        WHERE r.lease_token = per_run.lease_token
        ORDER BY r.id
        FOR NO KEY UPDATE OF r
    ), bumped AS (
        UPDATE runlane.runs AS r
        SET last_event_seq = r.last_event_seq + target.events
        FROM target
        WHERE r.id = target.id
        RETURNING r.id, target.lease_token, r.last_event_seq - target.events AS seq_before,
                  r.claim_count
    ), numbered AS MATERIALIZED (
        SELECT given.ord, given.run_id, bumped.seq_before + given.nth AS seq, given.kind,
               given.data, bumped.claim_count
        FROM given JOIN bumped
            ON bumped.id = given.run_id AND bumped.lease_token = given.lease_token
    ), appended AS (
        INSERT INTO runlane.run_events (run_id, seq, kind, data, attempt)
        SELECT numbered.run_id, numbered.seq, numbered.kind, numbered.data,
               numbered.claim_count
        FROM numbered
        ORDER BY numbered.ord
    )
    SELECT given.ord, numbered.seq
    FROM given LEFT JOIN numbered ON numbered.ord = given.ord
    ORDER BY given.ord;
END;
$$;
