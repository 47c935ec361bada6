-- The outcome write (a worker's batch of ended attempts) keeps its plans
-- for the session, pinned to primary-key lookups whatever the statistics
-- say.
--
-- Until now the statement was sent unprepared and planned for every batch
-- (about 0.5 ms of the batch's backend time), because a plan kept for the
-- session could be one made while runs held a hundred rows: a sequential
-- scan of runs joined to the batch, which read the whole table once it had
-- grown (30-40 ms per batch at 30,000 rows; BENCHMARKS.md, fifth session).
--
-- Here the statement runs inside a function whose plans are made once per
-- session (force_generic_plan) with the plan shapes that read a table
-- whole turned off: no sequential or bitmap scan, and no hash or merge
-- join (both read one side whole). What is left to join the batch to runs
-- is a nested loop probing the primary key with each run id of the batch,
-- which reads as many rows as the batch holds at any table size.
--
-- The batch is locked in run id order, as before, but the order is given
-- by a column of the batch (lock_order), not by runs.id: ordering by
-- runs.id would make a full scan of the primary key, in that order,
-- another way to produce the rows, one that a plan made for a small table
-- could take (a precaution: not seen in the tests). The lane relay and status notification
-- triggers, which fire inside the function, run under the same settings.
--
-- Semantics are those of the statement it replaces (queries.sql,
-- finish_attempts): fenced by lease token, one row back per ended run.
CREATE FUNCTION runlane.finish_attempts(
    p_run_ids uuid[],
    p_lease_tokens uuid[],
    p_outcomes text[],
    p_outputs jsonb[],
    p_errors jsonb[],
    p_retry_delays double precision[],
    p_interrupts jsonb[],
    p_interrupt_expires double precision[],
    p_notify boolean
) RETURNS TABLE (run_id uuid, run_status text, notifications bigint)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH input AS MATERIALIZED (
        SELECT i.*, row_number() OVER (ORDER BY i.run_id) AS lock_order
        FROM unnest(p_run_ids, p_lease_tokens, p_outcomes, p_outputs, p_errors,
                    p_retry_delays, p_interrupts, p_interrupt_expires)
            AS i(run_id, lease_token, outcome, output, error, retry_delay, interrupt,
                 expires_in)
    ), target AS (
        SELECT r.id, input.lease_token, input.outcome, input.output, input.error,
               input.retry_delay, input.interrupt, input.expires_in,
               CASE
                   WHEN input.outcome IN ('retry', 'released', 'steered', 'interrupted')
                        AND r.status = 'cancel_requested' THEN 'cancelled'
                   WHEN input.outcome = 'steered' THEN 'completed'
                   WHEN input.outcome NOT IN ('retry', 'released') THEN input.outcome
                   WHEN r.attempts >= r.max_attempts THEN 'dead'
                   ELSE 'pending'
               END AS next_status
        FROM input JOIN runlane.runs AS r ON r.id = input.run_id
        WHERE r.lease_token = input.lease_token
        ORDER BY input.lock_order
        FOR UPDATE OF r
    ), finished AS (
        UPDATE runlane.runs AS r
        SET status = target.next_status,
            available_at = CASE
                WHEN target.next_status <> 'pending' THEN r.available_at
                WHEN target.outcome = 'retry' THEN now() + make_interval(secs =>
                    least(coalesce(target.retry_delay, runlane.backoff_seconds(r.attempts)),
                          31536000))
                ELSE now()
            END,
            output = CASE WHEN target.next_status = 'completed' THEN target.output END,
            outcome = CASE WHEN target.next_status = 'completed' AND target.outcome = 'steered'
                           THEN 'steered' END,
            interrupt = CASE WHEN target.next_status = 'interrupted' THEN target.interrupt END,
            interrupt_expires_at = CASE
                WHEN target.next_status = 'interrupted' AND target.expires_in IS NOT NULL
                    THEN now() + make_interval(secs => least(target.expires_in, 31536000))
            END,
            error = CASE WHEN target.next_status IN ('completed', 'interrupted') THEN NULL
                         ELSE coalesce(target.error, r.error) END,
            finished_at = CASE WHEN target.next_status = 'pending' THEN NULL ELSE now() END,
            lease_token = NULL,
            lease_expires_at = NULL,
            worker_id = NULL
        FROM target
        WHERE r.id = target.id
        RETURNING r.id, r.status, r.agent, r.available_at, target.lease_token AS ended_token,
                  target.outcome AS ended_outcome, target.error AS ended_error
    ), attempt_rows AS (
        UPDATE runlane.run_attempts AS a
        SET ended_at = now(), outcome = finished.ended_outcome, error = finished.ended_error
        FROM finished
        WHERE a.run_id = finished.id AND a.lease_token = finished.ended_token
    ), notified AS (
        SELECT pg_notify('runlane_wakeup', finished.agent) FROM finished
        WHERE p_notify AND finished.status = 'pending' AND finished.available_at <= now()
    )
    -- The count is what makes the notifications happen: a CTE without
    -- data-modifying statements runs only as far as something reads it.
    SELECT finished.id, finished.status, (SELECT count(*) FROM notified)
    FROM finished;
END;
$$;
