-- A lane submit in one statement: runlane.submit_request.
--
-- Intake used to be seven statements in a transaction (lock the lane, look
-- up the request_id, read the lane's facts, store the request, dispatch it
-- or ask the active run to yield, read the request back), each a message
-- to the server and an answer. On the benchmark machine a third of the API
-- process's CPU per submit went to sending those messages over the socket
-- (py-spy: 40% of its samples in send()). The function does the same steps
-- in the same order, under the same lane lock, in one call.
--
-- The intake rules are here now (they were runlane.lanes.decide_intake):
--   * an interrupted lane refuses (REJECT stores a rejected request);
--   * REJECT stores a rejected request when the lane is paused, busy, or
--     has requests queued; otherwise it queues;
--   * STEER refuses while another steer waits; otherwise it queues first
--     and asks the active run (unless it is a resume) to yield;
--   * ENQUEUE queues;
--   * a queued request is dispatched at once when the lane is idle (no
--     active run, not paused, not interrupted).
-- tests/integration/test_lane_model.py checks them against a model of the
-- lane rules written apart from this code.
--
-- The same request_id again answers the stored request (created = false)
-- when it was for the same lane, input and policy; otherwise it refuses.
-- A refusal raises SQLSTATE RL409 with the refusal code as its message:
-- the statement's transaction rolls back, so a refusal stores nothing (not
-- even a lane it would have created).
--
-- Each statement in the function takes a new snapshot (READ COMMITTED), so
-- the facts are read after the lane lock is held, as before.
--
-- Its plans (and those of runlane.dispatch_head and of the foreign-key
-- checks it fires) are pinned like the run writes' of 0019: kept for the
-- session, with sequential and bitmap scans off, so each statement finds
-- its rows through its index whatever the statistics were when the plan
-- was made. The seven statements this replaces were prepared statements
-- and, made while the lane tables were small, read them whole as they grew
-- (42,417 rows read by two submits beside 3,000 busy lanes;
-- tests/integration/test_query_plans.py).
--
-- runlane.request_view is a request as callers see it, with its live
-- position while queued (a steer goes first, then server order): the
-- request_with_position query and submit_request both answer it.
-- runlane.find_request is a request by its client request_id. Both keep
-- pinned plans too: a client polling its request (GET /v1/requests/{id})
-- read 12,010 rows per poll on an API connection whose prepared plans were
-- made while the lane tables were small (test_query_plans.py).
CREATE FUNCTION runlane.request_view(p_id uuid)
RETURNS TABLE (
    id uuid, request_id text, tenant text, lane_id bigint, user_id text, agent text,
    thread_id text, policy text, steer boolean, status text, reason text, input jsonb,
    priority integer, metadata jsonb, run_id uuid, "position" bigint,
    created_at timestamptz, dispatched_at timestamptz, ended_at timestamptz
)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT q.id, q.request_id, q.tenant, q.lane_id, l.user_id, l.agent, l.thread_id,
           q.policy, q.steer, q.status, q.reason, q.input, q.priority, q.metadata, q.run_id,
           CASE WHEN q.status = 'queued' THEN 1 + (
               SELECT count(*) FROM runlane.requests AS o
               WHERE o.lane_id = q.lane_id AND o.status = 'queued'
                 AND ((o.steer AND NOT q.steer)
                      OR (o.steer = q.steer AND o.request_order < q.request_order)))
           END,
           q.created_at, q.dispatched_at, q.ended_at
    FROM runlane.requests AS q
    -- OFFSET 0 keeps this a lookup of the request's own lane: flattened
    -- into a join, a plan kept from when lanes held one row read every
    -- lane's index entry instead.
    CROSS JOIN LATERAL (
        SELECT l.user_id, l.agent, l.thread_id FROM runlane.lanes AS l
        WHERE l.id = q.lane_id
        OFFSET 0
    ) AS l
    WHERE q.id = p_id;
END;
$$;

CREATE FUNCTION runlane.find_request(p_tenant text, p_request_id text)
RETURNS SETOF runlane.requests
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    SELECT * FROM runlane.requests AS q
    WHERE q.tenant = p_tenant AND q.request_id = p_request_id;
END;
$$;

-- runlane.ask_to_yield asks a lane's active run to yield to a queued steer
-- at its next safe point (a pending run at its first, once claimed), and
-- wakes its worker. A resume carries a human's answer: the steer waits its
-- turn rather than throw the answer away. Intake and promote-to-steer both
-- call it.
CREATE FUNCTION runlane.ask_to_yield(p_run_id uuid) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE runlane.runs SET steer_requested_at = coalesce(steer_requested_at, now())
    WHERE id = p_run_id AND kind <> 'resume'
      AND status IN ('pending', 'running', 'cancel_requested');
    IF FOUND THEN
        PERFORM pg_notify('runlane_steer', p_run_id::text);
    END IF;
END;
$$;

CREATE FUNCTION runlane.submit_request(
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
    active_id uuid;
    queued bigint;
    queued_steer boolean;
    refusal text;
    rejection text;
    is_steer boolean := p_policy = 'steer';
    new_id uuid;
BEGIN
    INSERT INTO runlane.lanes (tenant, user_id, agent, thread_id)
    VALUES (p_tenant, p_user_id, p_agent, p_thread_id)
    ON CONFLICT (tenant, user_id, agent, thread_id) DO UPDATE SET updated_at = now()
    RETURNING * INTO lane;

    SELECT * INTO existing FROM runlane.requests
    WHERE tenant = p_tenant AND request_id = p_request_id;
    IF FOUND THEN
        IF existing.lane_id <> lane.id OR existing.input <> p_input
           OR existing.policy <> p_policy THEN
            RAISE EXCEPTION USING ERRCODE = 'RL409', MESSAGE = 'request_id_conflict';
        END IF;
        RETURN QUERY SELECT v.*, false FROM runlane.request_view(existing.id) AS v;
        RETURN;
    END IF;

    SELECT r.id INTO active_id FROM runlane.runs AS r
    WHERE r.lane_id = lane.id AND r.status IN ('pending', 'running', 'cancel_requested');
    SELECT count(*), coalesce(bool_or(q.steer), false) INTO queued, queued_steer
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

    UPDATE runlane.lanes SET last_request_order = last_request_order + 1
    WHERE id = lane.id
    RETURNING last_request_order INTO lane.last_request_order;
    INSERT INTO runlane.requests (request_id, tenant, lane_id, policy, steer, status, reason,
                                  input, priority, max_attempts, budget, metadata,
                                  request_order, ended_at)
    VALUES (p_request_id, p_tenant, lane.id, p_policy, is_steer,
            CASE WHEN rejection IS NULL THEN 'queued' ELSE 'rejected' END, rejection,
            p_input, p_priority, p_max_attempts, p_budget, p_metadata,
            lane.last_request_order, CASE WHEN rejection IS NULL THEN NULL ELSE now() END)
    RETURNING id INTO new_id;

    IF rejection IS NULL THEN
        IF active_id IS NULL AND lane.paused_run_id IS NULL THEN
            PERFORM runlane.dispatch_head(lane.id);
        ELSIF is_steer AND active_id IS NOT NULL THEN
            PERFORM runlane.ask_to_yield(active_id);
        END IF;
    END IF;
    RETURN QUERY SELECT v.*, true FROM runlane.request_view(new_id) AS v;
END;
$$;
