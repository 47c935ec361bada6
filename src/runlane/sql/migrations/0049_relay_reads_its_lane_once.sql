-- The relay reads its lane once: runlane.relay_lane locks the lane's row
-- and keeps it, and on a completed run hands it with the queue's head to
-- runlane.dispatch_request (0048) instead of calling
-- runlane.dispatch_head, which read the lane again.
--
-- Every lane run's end runs this trigger function in the outcome write's
-- transaction (0002), so it is on the path of target 3, the relay from one
-- run of a lane to the next. It ran, for a completed run with a request
-- waiting: the lane's lock, an UPDATE clearing an interrupt that almost
-- never matched a row, dispatch_head's call with its read of the head and
-- its read of the lane, then the dispatch. The lane's row comes back with
-- the lock now, and the interrupt is cleared only when the lane names this
-- run, which the row tells; the head is read here. What the relay does is
-- unchanged (0002's rules: the next head dispatched on completed, the lane
-- paused when a failed, dead or cancelled run leaves requests waiting, and
-- interrupted on interrupted).
CREATE OR REPLACE FUNCTION runlane.relay_lane() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    lane runlane.lanes%ROWTYPE;
    head runlane.requests%ROWTYPE;
BEGIN
    SELECT * INTO lane FROM runlane.lanes WHERE id = NEW.lane_id FOR UPDATE;
    IF NEW.status = 'interrupted' THEN
        UPDATE runlane.lanes
        SET interrupted_run_id = NEW.id, updated_at = now()
        WHERE id = NEW.lane_id;
        RETURN NULL;
    END IF;
    IF lane.interrupted_run_id = NEW.id THEN
        UPDATE runlane.lanes
        SET interrupted_run_id = NULL, updated_at = now()
        WHERE id = NEW.lane_id;
    END IF;
    IF NEW.status = 'completed' THEN
        SELECT * INTO head FROM runlane.requests
        WHERE lane_id = NEW.lane_id AND status = 'queued'
        ORDER BY steer DESC, request_order
        LIMIT 1
        FOR UPDATE;
        IF FOUND THEN
            PERFORM runlane.dispatch_request(lane, head);
        END IF;
    ELSIF EXISTS (SELECT 1 FROM runlane.requests
                  WHERE lane_id = NEW.lane_id AND status = 'queued') THEN
        UPDATE runlane.lanes
        SET paused_run_id = NEW.id, paused_reason = 'run_' || NEW.status, updated_at = now()
        WHERE id = NEW.lane_id;
    END IF;
    RETURN NULL;
END;
$$;
