-- The two row triggers that act when a run reaches a final status, the
-- lane's relay (runs_relay_lane) and the streams' notification
-- (runs_notify_status), fire on writes of finished_at instead of status,
-- with a shorter condition; a new check ties finished_at to the status.
--
-- PostgreSQL compiles a row trigger's WHEN condition, from its stored
-- text, once in every statement that sets a column the trigger names. Both
-- triggers named status, so every claim (which sets 'running' and cannot
-- make either fire) compiled both conditions, each with its array of the
-- five final statuses. Counted with callgrind (fortieth session, against
-- 0051; bench/results/*_s40_0052*.json): PostgreSQL's instructions per run
-- claimed and completed one statement at a time 0.91 on 18 and on 15, at
-- 200 runs per statement 0.99 and 1.00. The new check is compiled by every
-- statement that writes a run, a submit's INSERT too: a submit 1.02-1.04
-- of its instructions (direct, pushed, into a lane), a lane's head
-- dispatched 1.03; a relay 0.99. (The triggers moved with their old
-- conditions and no check, 0.91 and 0.98; with the check written on the
-- list of final statuses instead, 0.97 and 0.99: not kept.)
--
-- runs_finished_check: a run has finished_at exactly when it is neither
-- pending nor leased; the lease check (0001) ties a lease to 'running'
-- and 'cancel_requested', and the status domain allows eight values, so
-- that is exactly when its status is final (completed, failed, dead,
-- cancelled, interrupted). Every writer that ends a run sets finished_at
-- (the outcome write, the reaper, the cancel, the interrupt's expiry) and
-- every writer that makes a run live again clears it (the re-queue, the
-- reaper's retry, the outcome write's retry), in the SET list; no claim
-- names it. So a write of finished_at is the only way into a final
-- status, and the triggers, on finished_at, see every run that reaches
-- one. A write that would set a final status and leave finished_at empty,
-- an operator's UPDATE of status alone included, is refused by the check
-- rather than left without its relay. One change of a final status to
-- another that leaves finished_at out of its SET list (none of runlane's
-- writers does: the cancel of an interrupted run and its expiry set it)
-- is no longer relayed or notified; it was before.
--
-- Runs that an earlier version left otherwise (none is expected) are put
-- right first: a final run without finished_at takes now(), a live one
-- with it loses it (its kept attempt, if any, then moves to its row as a
-- re-queue moves it: 0051's trigger). The check is validated by reading
-- every run, under the lock of this migration (docs/operations.md,
-- Upgrades).
UPDATE runlane.runs SET finished_at = now()
WHERE finished_at IS NULL AND lease_token IS NULL AND status <> 'pending';

UPDATE runlane.runs SET finished_at = NULL
WHERE finished_at IS NOT NULL AND (lease_token IS NOT NULL OR status = 'pending');

ALTER TABLE runlane.runs ADD CONSTRAINT runs_finished_check
    CHECK ((finished_at IS NULL) = (lease_token IS NOT NULL OR status = 'pending'));

-- The conditions test finished_at where they listed the final statuses:
-- the same test under the check, and shorter text to compile.
DROP TRIGGER runs_relay_lane ON runlane.runs;
CREATE TRIGGER runs_relay_lane
    AFTER UPDATE OF finished_at ON runlane.runs
    FOR EACH ROW
    WHEN (NEW.lane_id IS NOT NULL
          AND NEW.finished_at IS NOT NULL
          AND NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION runlane.relay_lane();

DROP TRIGGER runs_notify_status ON runlane.runs;
CREATE TRIGGER runs_notify_status
    AFTER UPDATE OF finished_at ON runlane.runs
    FOR EACH ROW
    WHEN (NEW.finished_at IS NOT NULL
          AND NEW.status IS DISTINCT FROM OLD.status
          AND current_setting('runlane.run_changes_notified', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION runlane.notify_run_status();
