-- A run's status and kind are checked by domains, runlane.run_status and
-- runlane.run_kind, instead of the table constraints runs_status_check
-- and runs_kind_check.
--
-- PostgreSQL keeps a table's CHECK constraints as node strings and, in
-- every statement that inserts or updates rows of the table, reads them
-- back and plans them before the first row, whichever columns the
-- statement sets. Counted with callgrind (twentieth session, BENCHMARKS.md
-- section 1), that set-up was 36% of the instructions of a one-row INSERT
-- into runs, and the eight-status list of runs_status_check alone 19%.
-- A domain's constraints are read and planned once per connection and
-- kept in its type cache; they are checked where a value is given to the
-- column (an insert, an UPDATE that sets status), not by statements that
-- leave the column alone (an event, a checkpoint, a turn). Counted the
-- same way (twenty-first session), a run submitted by its own INSERT,
-- claimed and finished runs 10-11% fewer instructions, and one that also
-- appends five events 17-18% fewer; claims and finishes of 200 runs at a
-- time, one statement each, cost the same as before.
--
-- Each column changes type with no rewrite of the table: the domain has
-- no constraint yet when it does (text and a domain over text are the
-- same bytes), and the constraint is validated afterwards by reading the
-- rows. The ten indexes of runs whose predicates name status are built
-- again (a predicate now reads status through a cast to text), under the
-- ALTER's lock: 0.3 s for 100,000 runs on the twenty-first session's
-- machine (docs/operations.md, Upgrades). The two triggers whose column
-- list and WHEN name status must be dropped for the change and are
-- created again as they were (0002, 0028). Two functions that return a
-- run's status through RETURN QUERY declare it as text, which PL/pgSQL
-- holds to exactly: they cast it, and are otherwise as they were (0028,
-- 0024). Clients see text, as before: PostgreSQL describes a domain's
-- column by its base type.
CREATE DOMAIN runlane.run_status AS text;

DROP TRIGGER runs_relay_lane ON runlane.runs;
DROP TRIGGER runs_notify_status ON runlane.runs;

ALTER TABLE runlane.runs ALTER COLUMN status TYPE runlane.run_status;

ALTER DOMAIN runlane.run_status ADD CONSTRAINT run_status_check CHECK (VALUE IN (
    'pending', 'running', 'cancel_requested', 'completed', 'failed',
    'dead', 'cancelled', 'interrupted')) NOT VALID;
ALTER DOMAIN runlane.run_status VALIDATE CONSTRAINT run_status_check;
ALTER TABLE runlane.runs DROP CONSTRAINT runs_status_check;

CREATE DOMAIN runlane.run_kind AS text;
ALTER TABLE runlane.runs ALTER COLUMN kind TYPE runlane.run_kind;
ALTER DOMAIN runlane.run_kind ADD CONSTRAINT run_kind_check
    CHECK (VALUE IN ('direct', 'request', 'resume')) NOT VALID;
ALTER DOMAIN runlane.run_kind VALIDATE CONSTRAINT run_kind_check;
ALTER TABLE runlane.runs DROP CONSTRAINT runs_kind_check;

CREATE TRIGGER runs_relay_lane
    AFTER UPDATE OF status ON runlane.runs
    FOR EACH ROW
    WHEN (NEW.lane_id IS NOT NULL
          AND NEW.status IS DISTINCT FROM OLD.status
          AND NEW.status IN ('completed', 'failed', 'dead', 'cancelled', 'interrupted'))
    EXECUTE FUNCTION runlane.relay_lane();

CREATE TRIGGER runs_notify_status
    AFTER UPDATE OF status ON runlane.runs
    FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status
                       AND NEW.status IN ('completed', 'failed', 'dead', 'cancelled',
                                          'interrupted')
                       AND current_setting('runlane.run_changes_notified', true)
                           IS DISTINCT FROM 'on')
    EXECUTE FUNCTION runlane.notify_run_status();

-- 0028's outcome write; only the status it returns is cast to text.
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
    SELECT finished.id, finished.status::text, (SELECT count(*) FROM notified)
    FROM finished;
END;
$$;

-- 0024's gauges; only the status they return is cast to text.
CREATE OR REPLACE FUNCTION runlane.queue_gauges(p_tenant text)
RETURNS TABLE (status text, agent text, tenant text, count bigint,
               oldest_pending_seconds numeric)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT live.status::text, live.agent, live.tenant, count(*),
           extract(epoch FROM now() - min(live.available_at)
                                      FILTER (WHERE live.status = 'pending'))
    FROM (
        SELECT r.status, r.agent, r.tenant, r.available_at FROM runlane.runs AS r
        WHERE r.status = 'pending' AND (p_tenant IS NULL OR r.tenant = p_tenant)
        UNION ALL
        SELECT r.status, r.agent, r.tenant, r.available_at FROM runlane.runs AS r
        WHERE r.status IN ('running', 'cancel_requested')
          AND (p_tenant IS NULL OR r.tenant = p_tenant)
    ) AS live
    GROUP BY live.status, live.agent, live.tenant
    ORDER BY live.status, live.agent, live.tenant;
END;
$$;
