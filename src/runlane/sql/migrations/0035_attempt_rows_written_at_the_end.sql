-- An attempt's row is written once, when the attempt ends, instead of
-- inserted at the claim and updated at the end.
--
-- Every claimed run cost PostgreSQL two writes to run_attempts: the claim
-- inserted the row (worker, lease token, start) and the outcome write (or
-- the reaper, when the lease expired) updated it with its end. While the
-- attempt runs, the row said nothing the run's own row does not: the
-- leased run holds the worker, the token and the attempt number
-- (claim_count). Only the attempt's start was not there; it is now, in
-- runs.attempt_started_at, which the claim writes in the same row version
-- it writes anyway (the column is in no index, so nothing else changes).
-- The outcome write and the reaper insert the whole row, with the end, in
-- the statement that ends the lease, fenced as before: only the holder of
-- the token ends the attempt, once. The attempt in progress is read from
-- the run (list_attempts in queries.sql), so the attempts a run shows do
-- not change.
--
-- The table is insert-only now: its pages are filled again (0033 left
-- them half empty for the ends' HOT updates, which are gone).
--
-- Counted with callgrind (twenty-fifth session, BENCHMARKS.md section 1):
-- a backend claiming 200 runs at a time and finishing them runs 8%
-- fewer instructions per run (PostgreSQL 15 and 18), 2-3% with each run
-- submitted by its own INSERT.
--
-- Attempts in progress when this migration runs move into their runs: the
-- start of each open attempt row that matches its run's lease goes to the
-- run, and the row is deleted (its end will insert it again). A run
-- leased without such a row (none should be) counts its attempt from now.
ALTER TABLE runlane.runs ADD COLUMN attempt_started_at timestamptz;

UPDATE runlane.runs AS r
SET attempt_started_at = coalesce(
    (SELECT a.started_at FROM runlane.run_attempts AS a
     WHERE a.run_id = r.id AND a.lease_token = r.lease_token AND a.ended_at IS NULL),
    now())
WHERE r.lease_token IS NOT NULL;

DELETE FROM runlane.run_attempts AS a
USING runlane.runs AS r
WHERE a.run_id = r.id AND a.lease_token = r.lease_token AND a.ended_at IS NULL;

ALTER TABLE runlane.run_attempts SET (fillfactor = 100);

-- The claims (0034's uncapped, 0020's capped): the attempt's start on the
-- run, no attempt row; the UPDATE's rows are returned as they come, with
-- no CTE around it (it was there for the attempt insert that read them;
-- a data-modifying CTE stores every row it returns once more: 0.9% of the
-- instructions per run, counted in the twenty-fifth session).
CREATE OR REPLACE FUNCTION runlane.claim_uncapped_runs(
    p_worker_id text,
    p_agents text[],
    p_limit integer,
    p_lease_seconds double precision,
    p_aging_seconds double precision
) RETURNS SETOF runlane.runs
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET jit = off
AS $$
DECLARE
    picked tid[];
    -- Some candidate has waited p_aging_seconds or more, so aging may
    -- rank it above the first by priority. While none has, every run's
    -- effective priority is its priority and the first by priority are
    -- the claim's: the oldest need not be read and locked.
    aged boolean := false;
BEGIN
    -- The oldest run available (per agent), as by_age below would read it
    -- first but without a lock, and whether it waited a whole period. Its
    -- age is tested after the index gave it: an index condition on
    -- available_at would not end the scan of an agent's entries, which
    -- the agent's range (see below) keeps from being an equality.
    IF p_aging_seconds > 0 THEN
        IF p_agents IS NULL THEN
            aged := EXISTS (
                SELECT FROM (
                    SELECT available_at FROM runlane.runs
                    WHERE status = 'pending' AND available_at <= now()
                      AND attempts < max_attempts
                    ORDER BY available_at, seq
                    LIMIT 1
                ) AS oldest
                WHERE oldest.available_at <= now() - make_interval(secs => p_aging_seconds));
        ELSE
            aged := EXISTS (
                SELECT FROM unnest(p_agents) AS a(agent) CROSS JOIN LATERAL (
                    SELECT available_at FROM runlane.runs
                    WHERE status = 'pending' AND agent >= a.agent AND agent <= a.agent
                      AND available_at <= now() AND attempts < max_attempts
                    ORDER BY agent, available_at, seq
                    LIMIT 1
                ) AS oldest
                WHERE oldest.available_at <= now() - make_interval(secs => p_aging_seconds));
        END IF;
    END IF;
    -- Candidates: the first runs by priority and, once some run has
    -- aged, the oldest runs, locked with SKIP LOCKED; the best p_limit by
    -- effective priority are claimed, the others unlocked at commit.
    IF p_agents IS NULL THEN
        WITH by_priority AS (
            SELECT ctid, id, priority, available_at, seq FROM runlane.runs
            WHERE status = 'pending' AND available_at <= now() AND attempts < max_attempts
            ORDER BY priority DESC, available_at, seq
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ), by_age AS (
            SELECT ctid, id, priority, available_at, seq FROM runlane.runs
            WHERE status = 'pending' AND available_at <= now() AND attempts < max_attempts
              AND aged
            ORDER BY available_at, seq
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ), candidates AS (
            SELECT * FROM by_priority UNION SELECT * FROM by_age
        )
        SELECT array_agg(ctid) INTO picked FROM (
            SELECT c.ctid FROM candidates AS c
            ORDER BY c.priority + CASE WHEN p_aging_seconds > 0
                         THEN floor(extract(epoch FROM now() - c.available_at) / p_aging_seconds)
                         ELSE 0 END DESC,
                     c.available_at, c.seq
            LIMIT p_limit
        ) AS best;
    ELSE
        WITH candidates AS (
            SELECT c.* FROM unnest(p_agents) AS a(agent) CROSS JOIN LATERAL (
                SELECT ctid, id, priority, available_at, seq FROM runlane.runs
                WHERE status = 'pending' AND agent >= a.agent AND agent <= a.agent
                  AND available_at <= now() AND attempts < max_attempts
                ORDER BY agent, priority DESC, available_at, seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
            UNION
            SELECT c.* FROM unnest(p_agents) AS a(agent) CROSS JOIN LATERAL (
                SELECT ctid, id, priority, available_at, seq FROM runlane.runs
                WHERE status = 'pending' AND agent >= a.agent AND agent <= a.agent
                  AND available_at <= now() AND attempts < max_attempts AND aged
                ORDER BY agent, available_at, seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
        )
        SELECT array_agg(ctid) INTO picked FROM (
            SELECT c.ctid FROM candidates AS c
            ORDER BY c.priority + CASE WHEN p_aging_seconds > 0
                         THEN floor(extract(epoch FROM now() - c.available_at) / p_aging_seconds)
                         ELSE 0 END DESC,
                     c.available_at, c.seq
            LIMIT p_limit
        ) AS best;
    END IF;

    IF picked IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY
    UPDATE runlane.runs AS r
    SET status = 'running',
        attempts = r.attempts + 1,
        claim_count = r.claim_count + 1,
        lease_token = gen_random_uuid(),
        lease_expires_at = now() + make_interval(secs => p_lease_seconds),
        worker_id = p_worker_id,
        started_at = coalesce(r.started_at, now()),
        attempt_started_at = now(),
        deadline_at = coalesce(r.deadline_at, now() + make_interval(secs =>
            least((r.budget ->> 'max_seconds')::double precision, 31536000)))
    WHERE r.ctid = ANY(picked)
    RETURNING r.*;
END;
$$;

CREATE OR REPLACE FUNCTION runlane.claim_capped_runs(
    p_worker_id text,
    p_agents text[],
    p_limit integer,
    p_lease_seconds double precision,
    p_aging_seconds double precision
) RETURNS SETOF runlane.runs
LANGUAGE plpgsql
SET plan_cache_mode = force_custom_plan
SET enable_sort = on
AS $$
DECLARE
    locked_caps text[];
    busy_caps text[];
    free_tenants text[];
    free_slots bigint[];
    candidates uuid[];
BEGIN
    SELECT coalesce(array_agg(tenant), '{}') INTO locked_caps
    FROM (SELECT tenant FROM runlane.tenant_limits FOR UPDATE SKIP LOCKED) AS l;
    -- The free slots of the caps this claim holds, counted once: no other
    -- claimer can fill them while the cap rows are locked, and a count
    -- taken now can only be too high (runs may end meanwhile), never let
    -- a tenant past its cap.
    SELECT coalesce(array_agg(t.tenant), '{}'), coalesce(array_agg(greatest(t.max_running - (
               SELECT count(*) FROM runlane.runs AS x
               WHERE x.tenant = t.tenant AND x.status IN ('running', 'cancel_requested')), 0)),
           '{}')
    INTO free_tenants, free_slots
    FROM runlane.tenant_limits AS t
    WHERE t.tenant = ANY(locked_caps);
    -- Left out of the candidates: caps another claimer holds, and caps
    -- this claim holds whose tenant has no free slot.
    SELECT coalesce(array_agg(t.tenant), '{}') INTO busy_caps
    FROM runlane.tenant_limits AS t
    WHERE NOT t.tenant = ANY(locked_caps);
    SELECT busy_caps || coalesce(array_agg(f.tenant), '{}') INTO busy_caps
    FROM unnest(free_tenants, free_slots) AS f(tenant, free)
    WHERE f.free = 0;

    -- Sorts off for the candidates only (restored at the function's exit
    -- by its SET clause): the ranking below must sort, and with sorts off
    -- it would walk a whole index for the tenant order instead.
    SET LOCAL enable_sort = off;
    IF p_agents IS NULL THEN
        WITH by_priority AS (
            SELECT id FROM runlane.runs
            WHERE status = 'pending' AND available_at <= now() AND attempts < max_attempts
              AND NOT tenant = ANY(busy_caps)
            ORDER BY priority DESC, available_at, seq
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ), by_age AS (
            SELECT id FROM runlane.runs
            WHERE status = 'pending' AND available_at <= now() AND attempts < max_attempts
              AND NOT tenant = ANY(busy_caps)
              AND p_aging_seconds > 0
            ORDER BY available_at, seq
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        )
        SELECT array_agg(DISTINCT id) INTO candidates
        FROM (SELECT id FROM by_priority UNION ALL SELECT id FROM by_age) AS c;
    ELSE
        WITH by_priority AS (
            SELECT c.id FROM unnest(p_agents) AS a(agent)
            CROSS JOIN LATERAL (
                SELECT id FROM runlane.runs
                WHERE status = 'pending' AND agent >= a.agent AND agent <= a.agent
                  AND available_at <= now()
                  AND attempts < max_attempts AND NOT tenant = ANY(busy_caps)
                ORDER BY agent, priority DESC, available_at, seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
        ), by_age AS (
            SELECT c.id FROM unnest(p_agents) AS a(agent)
            CROSS JOIN LATERAL (
                SELECT id FROM runlane.runs
                WHERE status = 'pending' AND agent >= a.agent AND agent <= a.agent
                  AND available_at <= now()
                  AND attempts < max_attempts AND NOT tenant = ANY(busy_caps)
                  AND p_aging_seconds > 0
                ORDER BY agent, available_at, seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) AS c
        )
        SELECT array_agg(DISTINCT id) INTO candidates
        FROM (SELECT id FROM by_priority UNION ALL SELECT id FROM by_age) AS c;
    END IF;
    SET LOCAL enable_sort = on;

    IF candidates IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH scored AS (
        SELECT r.id, r.tenant, r.available_at, r.seq,
               r.priority + CASE WHEN p_aging_seconds > 0
                   THEN floor(extract(epoch FROM now() - r.available_at) / p_aging_seconds)
                   ELSE 0 END AS effective_priority
        FROM runlane.runs AS r
        WHERE r.id = ANY(candidates)
    ), slots AS (
        SELECT * FROM unnest(free_tenants, free_slots) AS s(tenant, free)
    ), ranked AS (
        SELECT scored.*, slots.free,
               row_number() OVER (PARTITION BY scored.tenant
                                  ORDER BY effective_priority DESC, available_at, seq)
                   AS tenant_rank
        FROM scored LEFT JOIN slots ON slots.tenant = scored.tenant
    ), picked AS (
        SELECT id FROM ranked
        WHERE free IS NULL OR tenant_rank <= free
        ORDER BY effective_priority DESC, available_at, seq
        LIMIT p_limit
    )
    UPDATE runlane.runs AS r
    SET status = 'running',
        attempts = r.attempts + 1,
        claim_count = r.claim_count + 1,
        lease_token = gen_random_uuid(),
        lease_expires_at = now() + make_interval(secs => p_lease_seconds),
        worker_id = p_worker_id,
        started_at = coalesce(r.started_at, now()),
        attempt_started_at = now(),
        deadline_at = coalesce(r.deadline_at, now() + make_interval(secs =>
            least((r.budget ->> 'max_seconds')::double precision, 31536000)))
    FROM picked
    WHERE r.id = picked.id
    RETURNING r.*;
END;
$$;

-- 0026's lane dispatch: a run pushed to a parked worker is inserted with
-- its attempt's start, and no attempt row.
CREATE OR REPLACE FUNCTION runlane.dispatch_head(p_lane_id bigint) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    head runlane.requests%ROWTYPE;
    lane runlane.lanes%ROWTYPE;
    new_run_id uuid;
    v_worker_id text;
    v_run_id uuid;
    v_lease_token uuid;
    v_lease_seconds double precision;
    payload text;
BEGIN
    SELECT * INTO head FROM runlane.requests
    WHERE lane_id = p_lane_id AND status = 'queued'
    ORDER BY steer DESC, request_order
    LIMIT 1
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT * INTO lane FROM runlane.lanes WHERE id = p_lane_id;
    -- Outside the relay (above): a parked worker's claim, or no row (nulls)
    -- when the run may not go to one now. Looked up only while some worker
    -- is parked: calling take_standing_claim when none is cost each API
    -- submit on idle lanes ~0.15 ms of PostgreSQL's CPU (7-10% of the
    -- submits per second, BENCHMARKS.md section 6); with this look first,
    -- 0.07-0.09 ms. (No JIT here: the callers that turn seqscans off, for
    -- their kept plans, turn jit off too.)
    IF pg_trigger_depth() = 0
       AND EXISTS (SELECT FROM runlane.standing_claims AS c
                   WHERE c.run_id IS NULL AND c.expires_at > now()) THEN
        SELECT s.worker_id, s.run_id, s.lease_token, s.lease_seconds
        INTO v_worker_id, v_run_id, v_lease_token, v_lease_seconds
        FROM runlane.take_standing_claim(lane.tenant, lane.agent, true) AS s;
    END IF;
    IF v_run_id IS NULL THEN
        INSERT INTO runlane.runs (tenant, user_id, thread_id, agent, input, priority,
                                  max_attempts, budget, metadata, lane_id, request_id, kind)
        VALUES (lane.tenant, lane.user_id, lane.thread_id, lane.agent, head.input,
                head.priority, head.max_attempts, head.budget, head.metadata, p_lane_id,
                head.id, 'request')
        RETURNING id INTO new_run_id;
        PERFORM pg_notify('runlane_wakeup', lane.agent);
    ELSE
        -- Inserted as the worker's claim would leave it; the NOTIFY carries
        -- the run as the claim answers it, unless too large for a payload
        -- (8,000 bytes): then it names the run, which the worker reads.
        INSERT INTO runlane.runs AS r (
            id, tenant, user_id, thread_id, agent, input, priority, max_attempts, budget,
            metadata, lane_id, request_id, kind, status, attempts, claim_count, lease_token,
            lease_expires_at, worker_id, started_at, attempt_started_at, deadline_at)
        VALUES (v_run_id, lane.tenant, lane.user_id, lane.thread_id, lane.agent, head.input,
                head.priority, head.max_attempts, head.budget, head.metadata, p_lane_id,
                head.id, 'request', 'running', 1, 1, v_lease_token,
                now() + make_interval(secs => v_lease_seconds), v_worker_id, now(), now(),
                now() + make_interval(secs =>
                    least((head.budget ->> 'max_seconds')::double precision, 31536000)))
        RETURNING r.id, json_build_object(
            'worker_id', r.worker_id,
            'run', to_json(r),
            'deadline_in_seconds', extract(epoch FROM r.deadline_at - now()))::text
        INTO new_run_id, payload;
        IF octet_length(payload) > 7900 THEN
            payload := json_build_object(
                'worker_id', v_worker_id, 'run_id', new_run_id,
                'lease_token', v_lease_token)::text;
        END IF;
        PERFORM pg_notify('runlane_push', payload);
    END IF;
    UPDATE runlane.requests
    SET status = 'dispatched', run_id = new_run_id, dispatched_at = now()
    WHERE id = head.id;
    RETURN new_run_id;
END;
$$;

-- 0032's outcome write: it inserts the ended attempt's row, with what the
-- run held for it (number, worker, start) read under the row lock before
-- the update clears the lease.
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
               r.claim_count AS attempt, r.worker_id, r.attempt_started_at
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
                  target.attempt_started_at AS ended_attempt_started_at
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
        SELECT pg_notify('runlane_run_changes', finished.id::text) FROM finished
        WHERE finished.status IN ('completed', 'failed', 'dead', 'cancelled', 'interrupted')
    )
    -- The count is what makes the notifications happen: a CTE without
    -- data-modifying statements runs only as far as something reads it.
    SELECT finished.id, finished.status::text, (SELECT count(*) FROM notified)
    FROM finished;
END;
$$;
