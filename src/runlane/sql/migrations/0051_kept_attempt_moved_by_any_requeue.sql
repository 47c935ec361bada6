-- A run's kept attempt (0050) moves to its run_attempts row whenever the
-- run is made pending again, whoever writes it.
--
-- 0050 kept a run's last ended attempt on the run and had the re-queue
-- (requeue_run) move it to its row. A re-queue sent by a process of an
-- earlier version, during a rolling upgrade, does not: the next claim
-- would then overwrite the attempt's number and start (claim_count,
-- attempt_started_at) and the next outcome the rest, and the attempt
-- would be lost from the run's history. Every writer that makes an ended
-- run pending again sets finished_at to NULL (the re-queue of every
-- version does), and no claim sets finished_at at all, so this trigger
-- fires on exactly those writes and moves the kept attempt then, with its
-- number and start still on the run, and clears the columns (a second
-- write of the row, on a re-queue only). requeue_run no longer moves it
-- itself: one mechanism for every writer.
--
-- Why this and not the other guards, counted with callgrind (thirty-ninth
-- session; PostgreSQL's instructions for a run claimed and completed, one
-- run per statement and 200 per statement, against 0049): 0050 alone
-- 1.01 and 0.96; with this trigger 1.02 and 0.97 (the outcome write, which
-- sets finished_at, compiles its condition; a claim does not); the kept
-- attempt with a number and a start of its own, moved by the next outcome
-- write, 1.04 and 0.97 (bench/results/backend_instructions_s39_kept_own_
-- columns*.json); 0050 taken back with its columns dropped, 1.00 and
-- 1.04: a dropped column stays in every row of runs, and five of them
-- cost a claim and an outcome of 200 runs 3% (counted alone).
--
-- Runs an earlier re-queue left in that state before this migration move
-- here too: a run not claimed since keeps its attempt's number and start;
-- one claimed again lost them to the claim, and its row takes the number
-- before the claim's and the attempt's end as its start (none is
-- expected: 0050 was never released).
INSERT INTO runlane.run_attempts (run_id, attempt, worker_id, lease_token, started_at,
                                  ended_at, outcome, error)
SELECT id,
       claim_count - CASE WHEN lease_token IS NULL THEN 0 ELSE 1 END,
       attempt_worker_id, attempt_lease_token,
       CASE WHEN lease_token IS NULL THEN attempt_started_at ELSE attempt_ended_at END,
       attempt_ended_at, attempt_outcome, attempt_error
FROM runlane.runs
WHERE attempt_outcome IS NOT NULL AND finished_at IS NULL;

UPDATE runlane.runs
SET attempt_worker_id = NULL, attempt_lease_token = NULL, attempt_ended_at = NULL,
    attempt_outcome = NULL, attempt_error = NULL
WHERE attempt_outcome IS NOT NULL AND finished_at IS NULL;

CREATE FUNCTION runlane.move_kept_attempt_to_history() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO runlane.run_attempts (run_id, attempt, worker_id, lease_token, started_at,
                                      ended_at, outcome, error)
    VALUES (NEW.id, NEW.claim_count, NEW.attempt_worker_id, NEW.attempt_lease_token,
            NEW.attempt_started_at, NEW.attempt_ended_at, NEW.attempt_outcome,
            NEW.attempt_error);
    UPDATE runlane.runs
    SET attempt_worker_id = NULL, attempt_lease_token = NULL, attempt_ended_at = NULL,
        attempt_outcome = NULL, attempt_error = NULL
    WHERE id = NEW.id;
    RETURN NULL;
END;
$$;

-- AFTER, not BEFORE: for a BEFORE row trigger PostgreSQL fetches each
-- updated row again before its condition is tested.
CREATE TRIGGER runs_move_kept_attempt
    AFTER UPDATE OF finished_at ON runlane.runs
    FOR EACH ROW
    WHEN (NEW.finished_at IS NULL AND NEW.attempt_outcome IS NOT NULL)
    EXECUTE FUNCTION runlane.move_kept_attempt_to_history();
