-- Lanes: per-thread request queues on top of runs.
--
-- A lane is the scope (tenant, user_id, agent, thread_id). A request is
-- accepted input; a run is created for it only when the lane lets it start.
-- Every change to a lane happens in a transaction holding the lane's row
-- lock (SELECT ... FOR UPDATE on runlane.lanes); the unique indexes below
-- hold the invariants even if code is wrong.

CREATE TABLE runlane.lanes (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant             text        NOT NULL,
    user_id            text        NOT NULL,
    agent              text        NOT NULL,
    thread_id          text        NOT NULL,
    -- Server-assigned order of the lane's requests.
    last_request_order bigint      NOT NULL DEFAULT 0,
    -- Set when the lane's run ended failed, dead or cancelled while
    -- requests waited; cleared by continue (or when the queue empties).
    paused_run_id      uuid,
    paused_reason      text,
    -- The lane's latest run, when it is interrupted and not yet resumed.
    interrupted_run_id uuid,
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant, user_id, agent, thread_id),
    CONSTRAINT lanes_paused_check CHECK ((paused_run_id IS NULL) = (paused_reason IS NULL))
);

CREATE TABLE runlane.requests (
    id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    -- Client-supplied (or generated) idempotency key, unique per tenant.
    request_id      text        NOT NULL,
    tenant          text        NOT NULL,
    lane_id         bigint      NOT NULL REFERENCES runlane.lanes (id) ON DELETE CASCADE,
    -- The policy of the original submission; promotion does not change it.
    policy          text        NOT NULL,
    -- Whether the request is (now) a steer: submitted as one, or promoted.
    steer           boolean     NOT NULL DEFAULT false,
    status          text        NOT NULL,
    reason          text,
    input           jsonb       NOT NULL,
    priority        integer     NOT NULL DEFAULT 0,
    max_attempts    integer     NOT NULL,
    budget          jsonb       NOT NULL DEFAULT '{}',
    metadata        jsonb       NOT NULL DEFAULT '{}',
    request_order   bigint      NOT NULL,
    run_id          uuid        REFERENCES runlane.runs (id) ON DELETE SET NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    dispatched_at   timestamptz,
    ended_at        timestamptz,
    UNIQUE (tenant, request_id),
    CONSTRAINT requests_policy_check CHECK (policy IN ('enqueue', 'reject', 'steer')),
    CONSTRAINT requests_status_check CHECK (
        status IN ('queued', 'dispatched', 'cancelled', 'rejected', 'failed'))
);

-- The queue of a lane, in dispatch order (a steer first, then server order).
CREATE INDEX requests_queue_idx ON runlane.requests (lane_id, steer DESC, request_order)
    WHERE status = 'queued';

-- Invariant 2: at most one queued steer per lane.
CREATE UNIQUE INDEX requests_one_queued_steer_idx ON runlane.requests (lane_id)
    WHERE status = 'queued' AND steer;

ALTER TABLE runlane.runs
    ADD COLUMN lane_id bigint REFERENCES runlane.lanes (id) ON DELETE SET NULL,
    ADD COLUMN request_id uuid REFERENCES runlane.requests (id) ON DELETE SET NULL,
    -- direct (no lane), request (dispatched from a lane's queue), resume.
    ADD COLUMN kind text NOT NULL DEFAULT 'direct',
    ADD COLUMN outcome text,
    ADD COLUMN resumed_from uuid REFERENCES runlane.runs (id) ON DELETE SET NULL,
    ADD COLUMN resume_value jsonb,
    ADD COLUMN interrupt jsonb,
    ADD COLUMN interrupt_expires_at timestamptz,
    -- A queued steer asked this run to yield at its next safe point.
    ADD COLUMN steer_requested_at timestamptz,
    ADD CONSTRAINT runs_kind_check CHECK (kind IN ('direct', 'request', 'resume'));

-- Invariant 1: at most one active run per lane.
CREATE UNIQUE INDEX runs_one_active_per_lane_idx ON runlane.runs (lane_id)
    WHERE lane_id IS NOT NULL AND status IN ('pending', 'running', 'cancel_requested');

-- A resume is created once per interrupted run.
CREATE UNIQUE INDEX runs_one_resume_idx ON runlane.runs (resumed_from)
    WHERE resumed_from IS NOT NULL;

CREATE INDEX runs_lane_idx ON runlane.runs (lane_id, created_at DESC) WHERE lane_id IS NOT NULL;

CREATE INDEX runs_interrupt_expiry_idx ON runlane.runs (interrupt_expires_at)
    WHERE status = 'interrupted' AND interrupt_expires_at IS NOT NULL;

-- Dispatches the head of a lane's queue (a steer first): creates its run
-- and marks it dispatched. The caller holds the lane's row lock and has
-- checked that the lane may start a run; the unique index refuses a second
-- active run regardless. Returns the new run's id, or NULL on an empty queue.
CREATE FUNCTION runlane.dispatch_head(p_lane_id bigint) RETURNS uuid
LANGUAGE plpgsql AS $$
DECLARE
    head runlane.requests%ROWTYPE;
    lane runlane.lanes%ROWTYPE;
    new_run_id uuid;
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
    INSERT INTO runlane.runs (tenant, thread_id, agent, input, priority, max_attempts,
                              budget, metadata, lane_id, request_id, kind)
    VALUES (lane.tenant, lane.thread_id, lane.agent, head.input, head.priority,
            head.max_attempts, head.budget, head.metadata, p_lane_id, head.id, 'request')
    RETURNING id INTO new_run_id;
    UPDATE runlane.requests
    SET status = 'dispatched', run_id = new_run_id, dispatched_at = now()
    WHERE id = head.id;
    PERFORM pg_notify('runlane_wakeup', lane.agent);
    RETURN new_run_id;
END;
$$;

-- The relay, in the same transaction as the terminal write of a lane's run:
--   completed           -> the next head is dispatched;
--   failed/dead/cancelled with requests waiting -> the lane pauses;
--   interrupted         -> the lane is interrupted (it keeps its queue).
-- Writers lock the lane row before the run row (see runlane.store), so the
-- lock taken here is already held and no deadlock arises.
CREATE FUNCTION runlane.relay_lane() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM runlane.lanes WHERE id = NEW.lane_id FOR UPDATE;
    IF NEW.status = 'interrupted' THEN
        UPDATE runlane.lanes
        SET interrupted_run_id = NEW.id, updated_at = now()
        WHERE id = NEW.lane_id;
        RETURN NULL;
    END IF;
    UPDATE runlane.lanes
    SET interrupted_run_id = NULL, updated_at = now()
    WHERE id = NEW.lane_id AND interrupted_run_id = NEW.id;
    IF NEW.status = 'completed' THEN
        PERFORM runlane.dispatch_head(NEW.lane_id);
    ELSIF EXISTS (SELECT 1 FROM runlane.requests
                  WHERE lane_id = NEW.lane_id AND status = 'queued') THEN
        UPDATE runlane.lanes
        SET paused_run_id = NEW.id, paused_reason = 'run_' || NEW.status, updated_at = now()
        WHERE id = NEW.lane_id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER runs_relay_lane
    AFTER UPDATE OF status ON runlane.runs
    FOR EACH ROW
    WHEN (NEW.lane_id IS NOT NULL
          AND NEW.status IS DISTINCT FROM OLD.status
          AND NEW.status IN ('completed', 'failed', 'dead', 'cancelled', 'interrupted'))
    EXECUTE FUNCTION runlane.relay_lane();
