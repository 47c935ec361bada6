-- The outcome write names the runs it ended in one NOTIFY per batch
-- instead of one per run.
--
-- Since 0028 runlane.finish_attempts has sent NOTIFY runlane_run_changes
-- with each run's id for every run it takes to a final status, which
-- wakes the API's streams of that run. A worker's batch of 200 outcomes
-- queued 200 notifications: each one a pg_notify call, an entry in the
-- server's notification queue at commit, and a read of that entry by
-- every listening connection (one per API process), most of which have
-- no subscriber for the run. Now one notification carries the ids of up
-- to 200 runs, comma-separated (36 bytes each: at most 7,399 bytes, under
-- the 8,000-byte payload limit); a larger batch sends one per 200, in
-- lock order. Every other writer of a final status (runs_notify_status)
-- still names one run, which is the same payload with one id. Measured
-- with two idle API processes listening while a worker burned down
-- 20,000 runs (BENCHMARKS.md section 6, thirty-seventh session): each
-- took 7.5 ms of CPU per 1,000 runs before, 2.25 after; PostgreSQL's own
-- instructions per run did not change (callgrind).
--
-- An API process of an earlier version reads a payload of several ids as
-- one unknown run: until it is rolled, its streams of those runs see the
-- change at their next periodic re-read (within 2 s) instead of at once;
-- nothing is lost (docs/operations.md, Upgrades).
--
-- Otherwise the function is 0035's: lock_order is carried through to
-- group the ids.
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
               END AS next_status,
               r.claim_count AS attempt, r.worker_id, r.attempt_started_at,
               input.lock_order
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
                  target.outcome AS ended_outcome, target.error AS ended_error,
                  target.attempt AS ended_attempt, target.worker_id AS ended_worker_id,
                  target.attempt_started_at AS ended_attempt_started_at,
                  target.lock_order
    ), attempt_rows AS (
        INSERT INTO runlane.run_attempts (run_id, attempt, worker_id, lease_token, started_at,
                                          ended_at, outcome, error)
        SELECT finished.id, finished.ended_attempt, finished.ended_worker_id,
               finished.ended_token, finished.ended_attempt_started_at, now(),
               finished.ended_outcome, finished.ended_error
        FROM finished
    ), notified AS (
        SELECT pg_notify('runlane_wakeup', finished.agent) FROM finished
        WHERE p_notify AND finished.status = 'pending' AND finished.available_at <= now()
        UNION ALL
        SELECT pg_notify('runlane_run_changes', string_agg(finished.id::text, ','))
        FROM finished
        WHERE finished.status IN ('completed', 'failed', 'dead', 'cancelled', 'interrupted')
        GROUP BY (finished.lock_order - 1) / 200
    )
    -- The count is what makes the notifications happen: a CTE without
    -- data-modifying statements runs only as far as something reads it.
    SELECT finished.id, finished.status::text, (SELECT count(*) FROM notified)
    FROM finished;
END;
$$;
