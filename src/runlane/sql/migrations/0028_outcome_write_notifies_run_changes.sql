-- The outcome write sends the API's run-change notifications itself,
-- instead of runs_notify_status sending one per row.
--
-- The trigger (0003) fires after each run that an UPDATE takes to a final
-- status (completed, failed, dead, cancelled, interrupted) and sends
-- NOTIFY runlane_run_changes with the run's id, which wakes the API's
-- streams of that run. On a worker's hot path that meant a trigger
-- event queued and a PL/pgSQL call for every finished run. Counted with
-- callgrind (eighteenth session, BENCHMARKS.md section 1), a backend that
-- claims 200 runs at a time and finishes them ran 5.7% fewer instructions
-- per run when runlane.finish_attempts sends the same notifications from
-- its own statement (and 7.9% fewer with no notification at all, which
-- the streams need).
--
-- The function marks its own scope with the setting
-- runlane.run_changes_notified = 'on' (a SET clause, so it ends with the
-- call), and the trigger's WHEN skips updates made in that scope. Every
-- other writer of a final status (a cancel, the reaper, an operator's
-- UPDATE, the lanes' paths) still gets the trigger's notification. Inside
-- the function no statement other than its own outcome write takes a run
-- to a final status: the lane relay it fires inserts the lane's next run
-- and claims along write running runs.
--
-- Otherwise the function is 0015's.
CREATE OR REPLACE FUNCTION runlane.finish_attempts(
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
SET runlane.run_changes_notified = 'on'
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
        UNION ALL
        SELECT pg_notify('runlane_run_changes', finished.id::text) FROM finished
        WHERE finished.status IN ('completed', 'failed', 'dead', 'cancelled', 'interrupted')
    )
    -- The count is what makes the notifications happen: a CTE without
    -- data-modifying statements runs only as far as something reads it.
    SELECT finished.id, finished.status, (SELECT count(*) FROM notified)
    FROM finished;
END;
$$;

DROP TRIGGER runs_notify_status ON runlane.runs;
CREATE TRIGGER runs_notify_status
    AFTER UPDATE OF status ON runlane.runs
    FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status
                       AND NEW.status IN ('completed', 'failed', 'dead', 'cancelled',
                                          'interrupted')
                       AND current_setting('runlane.run_changes_notified', true)
                           IS DISTINCT FROM 'on')
    EXECUTE FUNCTION runlane.notify_run_status();
