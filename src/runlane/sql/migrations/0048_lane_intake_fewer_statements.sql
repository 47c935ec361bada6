-- A lane submit runs fewer statements: runlane.submit_request takes the
-- request's order in the lane's upsert, reads the lane's facts in one
-- statement, dispatches its request without reading it and its lane back,
-- and answers the request from what it wrote.
--
-- Every submit through POST /v1/threads/{t}/requests is one call of this
-- function, and PostgreSQL's CPU is about half of what a submit costs
-- there (BENCHMARKS.md section 6). Each statement a plpgsql function runs
-- pays an executor start and end of its own, whatever rows it touches: a
-- perf profile of the server under the API benchmark (thirty-eighth
-- session) put executor start-up alone at a sixth of the backends' time.
-- Five of the statements it ran did no work that the others could not do:
--   * the lane's row was written twice, by the upsert that locks it and by
--     an UPDATE that took the next request order: the upsert now takes the
--     order itself (1 for a new lane), one row version instead of two;
--   * the active run and the queued requests were two SELECTs: now one;
--   * runlane.dispatch_head read back the request just stored and the
--     lane just locked: the submit now hands both rows to
--     runlane.dispatch_request (below), the part of dispatch_head after
--     those two reads;
--   * the answer was read back through runlane.request_view, a function
--     call with four SET clauses and a read of the request and its lane:
--     this function has just written the request and holds the lane's row
--     lock, so it knows the answer (a dispatched request's run is the one
--     runlane.dispatch_request returns; a queued request's position follows
--     from the queue it counted). Only when the lane was idle with
--     requests already queued (left for recovery's dispatch) might the
--     dispatched head be another request: then it still reads the view.
--
-- A request_id seen before answers the stored request and must not use up
-- an order: the upsert took one, so that rare path gives it back, and
-- last_request_order counts as it did before.
--
-- The intake rules, the lock order and the plans' settings are 0022's.

-- The dispatch of a lane's head request, split in two: runlane.dispatch_head
-- finds the head and reads the lane, as before, and runlane.dispatch_request
-- makes the run of a request whose lane and request rows its caller holds
-- locked (0046's body, unchanged). The relay and recovery call the first;
-- a submit that has just stored the only request of an idle lane calls the
-- second, without reading back the two rows it has in hand.
CREATE FUNCTION runlane.dispatch_request(lane runlane.lanes, head runlane.requests)
RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    p_lane_id bigint := lane.id;
    new_run_id uuid;
    v_worker_id text;
    v_run_id uuid;
    v_lease_token uuid;
    v_lease_seconds double precision;
    payload text;
BEGIN
    -- Outside the relay (a trigger): a parked worker's claim, or no row (nulls)
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
CREATE OR REPLACE FUNCTION runlane.dispatch_head(p_lane_id bigint) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    head runlane.requests%ROWTYPE;
    lane runlane.lanes%ROWTYPE;
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
    RETURN runlane.dispatch_request(lane, head);
END;
$$;

CREATE OR REPLACE FUNCTION runlane.submit_request(
    p_tenant text,
    p_user_id text,
    p_agent text,
    p_thread_id text,
    p_request_id text,
    p_policy text,
    p_input jsonb,
    p_priority integer,
    p_max_attempts integer,
    p_budget jsonb,
    p_metadata jsonb
) RETURNS TABLE (
    id uuid, request_id text, tenant text, lane_id bigint, user_id text, agent text,
    thread_id text, policy text, steer boolean, status text, reason text, input jsonb,
    priority integer, metadata jsonb, run_id uuid, "position" bigint,
    created_at timestamptz, dispatched_at timestamptz, ended_at timestamptz, created boolean
)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    lane runlane.lanes%ROWTYPE;
    existing runlane.requests%ROWTYPE;
    stored runlane.requests%ROWTYPE;
    active_id uuid;
    queued bigint;
    queued_steer boolean;
    refusal text;
    rejection text;
    is_steer boolean := p_policy = 'steer';
    dispatched_run_id uuid;
BEGIN
    INSERT INTO runlane.lanes AS l (tenant, user_id, agent, thread_id, last_request_order)
    VALUES (p_tenant, p_user_id, p_agent, p_thread_id, 1)
    ON CONFLICT (tenant, user_id, agent, thread_id) DO UPDATE
    SET updated_at = now(), last_request_order = l.last_request_order + 1
    RETURNING * INTO lane;

    SELECT * INTO existing FROM runlane.requests
    WHERE tenant = p_tenant AND request_id = p_request_id;
    IF FOUND THEN
        IF existing.lane_id <> lane.id OR existing.input <> p_input
           OR existing.policy <> p_policy THEN
            RAISE EXCEPTION USING ERRCODE = 'RL409', MESSAGE = 'request_id_conflict';
        END IF;
        UPDATE runlane.lanes SET last_request_order = last_request_order - 1
        WHERE id = lane.id;
        RETURN QUERY SELECT v.*, false FROM runlane.request_view(existing.id) AS v;
        RETURN;
    END IF;

    SELECT (SELECT r.id FROM runlane.runs AS r
            WHERE r.lane_id = lane.id AND r.status IN ('pending', 'running', 'cancel_requested')),
           count(*), coalesce(bool_or(q.steer), false)
    INTO active_id, queued, queued_steer
    FROM runlane.requests AS q
    WHERE q.lane_id = lane.id AND q.status = 'queued';

    IF lane.interrupted_run_id IS NOT NULL THEN
        IF p_policy = 'reject' THEN
            rejection := 'run_interrupted';
        ELSE
            refusal := 'run_interrupted';
        END IF;
    ELSIF p_policy = 'reject' THEN
        IF lane.paused_run_id IS NOT NULL THEN
            rejection := 'lane_paused';
        ELSIF active_id IS NOT NULL THEN
            rejection := 'lane_busy';
        ELSIF queued > 0 THEN
            rejection := 'queue_not_empty';
        END IF;
    ELSIF is_steer AND queued_steer THEN
        refusal := 'steer_already_pending';
    END IF;
    IF refusal IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'RL409', MESSAGE = refusal;
    END IF;

    INSERT INTO runlane.requests (request_id, tenant, lane_id, policy, steer, status, reason,
                                  input, priority, max_attempts, budget, metadata,
                                  request_order, ended_at)
    VALUES (p_request_id, p_tenant, lane.id, p_policy, is_steer,
            CASE WHEN rejection IS NULL THEN 'queued' ELSE 'rejected' END, rejection,
            p_input, p_priority, p_max_attempts, p_budget, p_metadata,
            lane.last_request_order, CASE WHEN rejection IS NULL THEN NULL ELSE now() END)
    RETURNING * INTO stored;

    IF rejection IS NULL THEN
        IF active_id IS NULL AND lane.paused_run_id IS NULL THEN
            IF queued > 0 THEN
                -- An idle lane with requests queued (left for recovery):
                -- its head, maybe an older request, goes first.
                PERFORM runlane.dispatch_head(lane.id);
                RETURN QUERY SELECT v.*, true FROM runlane.request_view(stored.id) AS v;
                RETURN;
            END IF;
            dispatched_run_id := runlane.dispatch_request(lane, stored);
            -- As dispatch_request wrote it, in this transaction (now()).
            stored.status := 'dispatched';
            stored.run_id := dispatched_run_id;
            stored.dispatched_at := now();
        ELSIF is_steer AND active_id IS NOT NULL THEN
            PERFORM runlane.ask_to_yield(active_id);
        END IF;
    END IF;
    -- A queued request's position (1 = next): a steer goes first (a second
    -- one is refused above), any other request after every one queued.
    RETURN QUERY SELECT
        stored.id, stored.request_id, stored.tenant, stored.lane_id, lane.user_id, lane.agent,
        lane.thread_id, stored.policy, stored.steer, stored.status, stored.reason, stored.input,
        stored.priority, stored.metadata, stored.run_id,
        CASE WHEN stored.status <> 'queued' THEN NULL
             WHEN is_steer THEN 1::bigint
             ELSE queued + 1 END,
        stored.created_at, stored.dispatched_at, stored.ended_at, true;
END;
$$;
