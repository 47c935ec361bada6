-- A run's last attempt stays on the run: the outcome write inserts an
-- attempt's row only when another attempt follows it.
--
-- Since 0035 every ended attempt cost an INSERT into run_attempts (its
-- heap tuple, its primary key's entry, their WAL) in the outcome write,
-- for the attempt of nearly every run, the one that completed it. The
-- outcome write rewrites the run's row anyway, so the ended attempt now
-- goes there, in five columns (attempt_worker_id, attempt_lease_token,
-- attempt_ended_at, attempt_outcome, attempt_error; its number is
-- claim_count and its start attempt_started_at, which the run already
-- holds) whenever the run takes a status that is not 'pending': completed,
-- failed, dead, cancelled or interrupted. A retried or released attempt is
-- followed by another claim, so its row is written as before.
--
-- A run that leaves such a status for a live one (only a re-queue of a
-- failed or dead run does: requeue_run in queries.sql) moved that
-- attempt into run_attempts in the same statement and cleared the
-- columns, so that the next claim may take the run and number its
-- attempt as before. 0051 moves it in a trigger on finished_at instead,
-- for every writer, an older process's re-queue included. Not a trigger
-- on status: a row trigger's condition is compiled again by every
-- statement that sets the columns it names, and every claim sets status
-- (such a trigger cost a lane relay 2% of its instructions, counted).
--
-- The reaper still inserts the expired attempt's row for every run it
-- ends, retried or not: it is rare, and a run's attempts are read through
-- the view runlane.attempts below, which holds them whichever way.
--
-- Counted with callgrind (thirty-ninth session, python -m
-- bench.backend_instructions --batch 200 --loops 20,60 --sql-file F, F
-- this migration): PostgreSQL's instructions per claimed and completed
-- run 0.96 of 0049's on PostgreSQL 18 and 15 (0.97 with 0051's guard).
--
-- Every attempt of every run: the ended ones with a row, the last ended
-- one still on its run, and the one in progress (0035). list_attempts
-- and the fault suite read this view; nothing reads run_attempts alone
-- for a run's attempts any more. An API process of an earlier version
-- reads run_attempts and the attempt in progress: until it is rolled it
-- does not show the last attempt of a run ended after this migration
-- (docs/operations.md, Upgrades).
ALTER TABLE runlane.runs
    ADD COLUMN attempt_worker_id text,
    ADD COLUMN attempt_lease_token uuid,
    ADD COLUMN attempt_ended_at timestamptz,
    ADD COLUMN attempt_outcome text,
    ADD COLUMN attempt_error jsonb;

CREATE VIEW runlane.attempts AS
SELECT run_id, attempt, worker_id, lease_token, started_at, ended_at, outcome, error
FROM runlane.run_attempts
UNION ALL
SELECT id, claim_count, attempt_worker_id, attempt_lease_token, attempt_started_at,
       attempt_ended_at, attempt_outcome, attempt_error
FROM runlane.runs WHERE attempt_outcome IS NOT NULL
UNION ALL
SELECT id, claim_count, worker_id, lease_token, attempt_started_at, NULL, NULL, NULL
FROM runlane.runs WHERE lease_token IS NOT NULL;

-- 0047's outcome write, with the ended attempt on the run unless the run
-- goes back to 'pending', and run_attempts' row only then.
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
            -- The ended attempt, kept on the run unless another follows.
            attempt_worker_id = CASE WHEN target.next_status <> 'pending'
                                     THEN target.worker_id END,
            attempt_lease_token = CASE WHEN target.next_status <> 'pending'
                                       THEN target.lease_token END,
            attempt_ended_at = CASE WHEN target.next_status <> 'pending' THEN now() END,
            attempt_outcome = CASE WHEN target.next_status <> 'pending'
                                   THEN target.outcome END,
            attempt_error = CASE WHEN target.next_status <> 'pending' THEN target.error END,
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
        WHERE finished.status = 'pending'
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
