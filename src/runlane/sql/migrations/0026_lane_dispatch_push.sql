-- A lane's request goes straight to a parked worker, as a direct run does
-- (standing claims, 0025).
--
-- runlane.dispatch_head turns a lane's next request into its run: at
-- intake when the lane is idle, in the relay when the lane's run
-- completes, and when a paused or interrupted lane goes on (continue,
-- promotion to steer, recovery). Until now the run was always inserted
-- pending with a wake-up NOTIFY, so a request to an idle lane waited for a
-- parked worker to wake, unpark and claim it: a commit and a round trip
-- more on its way to the handler than a direct run's. Now, when
-- runlane.take_standing_claim gives it a parked worker's claim (a worker
-- parked for the agent, the tenant without a cap, no run of the agent
-- already waiting), the run is inserted already claimed by that worker
-- (running, its lease, its first attempt row, as a claim writes them) and
-- runlane_push carries it to that worker, as insert_run in queries.sql
-- does. Otherwise it waits pending and runlane_wakeup wakes the workers,
-- as before.
--
-- Not in the relay: there dispatch_head runs in the runs_relay_lane
-- trigger, inside the outcome write of the worker that finished the
-- lane's run, and that worker's outcome batch claims the lane's next run
-- along with it (CompletionBatcher's claim along) without a push. Looking
-- for a parked worker on every relay cost the relay benchmark's drain of
-- 1,000 lanes 5-10% of its rate and gained its relay gap nothing
-- (BENCHMARKS.md, section 3). pg_trigger_depth() tells the two apart: the
-- intake (submit_request) and the lanes layer's own calls run outside any
-- trigger.
--
-- The lane's rules do not change: dispatch_head runs only when the lane
-- has no active run, under the lane's lock, and the request is marked
-- dispatched with the run in the same transaction either way.
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
            lease_expires_at, worker_id, started_at, deadline_at)
        VALUES (v_run_id, lane.tenant, lane.user_id, lane.thread_id, lane.agent, head.input,
                head.priority, head.max_attempts, head.budget, head.metadata, p_lane_id,
                head.id, 'request', 'running', 1, 1, v_lease_token,
                now() + make_interval(secs => v_lease_seconds), v_worker_id, now(),
                now() + make_interval(secs =>
                    least((head.budget ->> 'max_seconds')::double precision, 31536000)))
        RETURNING r.id, json_build_object(
            'worker_id', r.worker_id,
            'run', to_json(r),
            'deadline_in_seconds', extract(epoch FROM r.deadline_at - now()))::text
        INTO new_run_id, payload;
        INSERT INTO runlane.run_attempts (run_id, attempt, worker_id, lease_token)
        VALUES (new_run_id, 1, v_worker_id, v_lease_token);
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
