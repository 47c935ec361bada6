-- The HTTP API: API keys, run owners, and NOTIFY for live event streams.

CREATE TABLE runlane.api_keys (
    id           uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    -- The key's public part, shown in listings ("rl_" + 8 characters).
    prefix       text        NOT NULL UNIQUE,
    -- sha256 of the whole key, hex; the key itself is never stored.
    key_hash     text        NOT NULL UNIQUE,
    tenant       text        NOT NULL,
    user_id      text        NOT NULL,
    admin        boolean     NOT NULL DEFAULT false,
    name         text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz,
    last_used_at timestamptz
);

-- Who submitted a run (a lane's user for lanes' runs). Non-admin keys see
-- only their own user's runs.
ALTER TABLE runlane.runs ADD COLUMN user_id text NOT NULL DEFAULT 'default';

CREATE INDEX runs_owner_listing_idx ON runlane.runs (tenant, user_id, created_at DESC, id);

-- Lanes' runs belong to the lane's user.
CREATE OR REPLACE FUNCTION runlane.dispatch_head(p_lane_id bigint) RETURNS uuid
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
    INSERT INTO runlane.runs (tenant, user_id, thread_id, agent, input, priority, max_attempts,
                              budget, metadata, lane_id, request_id, kind)
    VALUES (lane.tenant, lane.user_id, lane.thread_id, lane.agent, head.input, head.priority,
            head.max_attempts, head.budget, head.metadata, p_lane_id, head.id, 'request')
    RETURNING id INTO new_run_id;
    UPDATE runlane.requests
    SET status = 'dispatched', run_id = new_run_id, dispatched_at = now()
    WHERE id = head.id;
    PERFORM pg_notify('runlane_wakeup', lane.agent);
    RETURN new_run_id;
END;
$$;

-- Live delivery for event streams. NOTIFY only wakes the API's single
-- listening connection; subscribers then read the tables, which stay the
-- source of truth (a lost NOTIFY delays, never loses, an event).
CREATE FUNCTION runlane.notify_run_event() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('runlane_run_changes', NEW.run_id::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER run_events_notify
    AFTER INSERT ON runlane.run_events
    FOR EACH ROW EXECUTE FUNCTION runlane.notify_run_event();

CREATE FUNCTION runlane.notify_run_status() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('runlane_run_changes', NEW.id::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER runs_notify_status
    AFTER UPDATE OF status ON runlane.runs
    FOR EACH ROW WHEN (NEW.status IS DISTINCT FROM OLD.status
                       AND NEW.status IN ('completed', 'failed', 'dead', 'cancelled',
                                          'interrupted'))
    EXECUTE FUNCTION runlane.notify_run_status();

CREATE FUNCTION runlane.notify_lane_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('runlane_lane_changes', NEW.lane_id::text);
    RETURN NULL;
END;
$$;

CREATE TRIGGER requests_notify_change
    AFTER INSERT OR UPDATE OF status, steer ON runlane.requests
    FOR EACH ROW EXECUTE FUNCTION runlane.notify_lane_change();
