-- A lane's run pushed to a parked worker (runlane.dispatch_head, 0035's,
-- otherwise as it was) carries the claim's columns in ClaimedRun's order,
-- as an array under `claim`, as a submit's push does since the
-- thirty-sixth session (insert_run in queries.sql): the run's whole row as
-- an object (to_json, `run`) cost a pushing submit 8% more of
-- PostgreSQL's instructions and gave the worker four times the bytes to
-- decode (BENCHMARKS.md, section 2). Workers of this version read both
-- shapes; one of an earlier version finds no `run` in the new one and
-- claims the run by unparking instead, as with any push it cannot read.
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
            'claim', json_build_array(
                r.id, r.agent, r.tenant, r.user_id, r.thread_id, r.kind, r.lane_id,
                r.input, r.attempts, r.max_attempts, r.turns, r.checkpoint, r.resume_value,
                r.metadata, r.budget, r.steer_requested_at, r.lease_token),
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
