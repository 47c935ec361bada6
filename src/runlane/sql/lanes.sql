-- Named queries of the lanes layer. Each block starts with "-- name: NAME";
-- runlane.lane_store owns them. Every statement that changes a lane runs in
-- a transaction that took the lane's row lock first (lock_lane, or the
-- upsert in runlane.submit_request).

-- name: find_lane
SELECT * FROM runlane.lanes
WHERE tenant = %(tenant)s AND user_id = %(user_id)s AND agent = %(agent)s
  AND thread_id = %(thread_id)s;

-- name: lock_lane
SELECT * FROM runlane.lanes WHERE id = %(lane_id)s FOR UPDATE;

-- name: lane_facts
-- What intake and continue decide on; the caller holds the lane lock.
SELECT
    active.id AS active_run_id,
    active.steer_requested_at IS NOT NULL AS active_run_asked_to_yield,
    (SELECT count(*) FROM runlane.requests
     WHERE lane_id = %(lane_id)s AND status = 'queued') AS queued,
    (SELECT id FROM runlane.requests
     WHERE lane_id = %(lane_id)s AND status = 'queued' AND steer) AS queued_steer_id
FROM (SELECT 1) AS one
LEFT JOIN runlane.runs AS active
    ON active.lane_id = %(lane_id)s AND active.status IN ('pending', 'running', 'cancel_requested');

-- name: find_request
-- A request by its client request_id (runlane.find_request, migration 0022).
SELECT * FROM runlane.find_request(%(tenant)s, %(request_id)s);

-- name: submit_request
-- A submission into a lane, in one statement (runlane.submit_request,
-- migration 0022): the request as stored, with its position and whether this
-- call created it. A refusal raises SQLSTATE RL409 and stores nothing.
SELECT * FROM runlane.submit_request(
    %(tenant)s, %(user_id)s, %(agent)s, %(thread_id)s, %(request_id)s, %(policy)s,
    %(input)s, %(priority)s, %(max_attempts)s, %(budget)s, %(metadata)s);

-- name: dispatch_head
SELECT runlane.dispatch_head(%(lane_id)s) AS run_id;

-- name: request_steer
-- Asks the lane's active run to yield to a steer (runlane.ask_to_yield,
-- migration 0022: not a resume's run).
SELECT runlane.ask_to_yield(%(run_id)s);

-- name: request_with_position
-- A request with its live position (1 = next) while queued: a steer goes
-- first, then server order (runlane.request_view, migration 0022).
SELECT * FROM runlane.request_view(%(id)s);

-- name: queued_requests
SELECT q.*, l.user_id, l.agent, l.thread_id,
       row_number() OVER (ORDER BY q.steer DESC, q.request_order) AS position
FROM runlane.requests AS q JOIN runlane.lanes AS l ON l.id = q.lane_id
WHERE q.lane_id = %(lane_id)s AND q.status = 'queued'
ORDER BY q.steer DESC, q.request_order;

-- name: cancel_request
UPDATE runlane.requests SET status = 'cancelled', ended_at = now()
WHERE id = %(id)s AND status = 'queued'
RETURNING id;

-- name: promote_request
UPDATE runlane.requests SET steer = true
WHERE id = %(id)s AND status = 'queued'
RETURNING id;

-- name: unpause_lane
UPDATE runlane.lanes
SET paused_run_id = NULL, paused_reason = NULL, updated_at = now()
WHERE id = %(lane_id)s;

-- name: insert_resume_run
-- The resume of an interrupted run: a new run outside the request queue,
-- with the answer and the interrupted run's last checkpoint.
WITH resumed AS (
    INSERT INTO runlane.runs (tenant, user_id, thread_id, agent, input, priority,
                              max_attempts, budget, metadata, checkpoint, lane_id,
                              request_id, kind, resumed_from, resume_value)
    SELECT tenant, user_id, thread_id, agent, input, priority, max_attempts, budget, metadata,
           checkpoint, lane_id, request_id, 'resume', id, %(value)s
    FROM runlane.runs
    WHERE id = %(run_id)s AND status = 'interrupted'
    RETURNING *
), cleared AS (
    UPDATE runlane.lanes SET interrupted_run_id = NULL, updated_at = now()
    WHERE id = (SELECT lane_id FROM resumed) AND interrupted_run_id = %(run_id)s
), answered AS (
    -- An answered interrupt no longer expires.
    UPDATE runlane.runs SET interrupt_expires_at = NULL
    WHERE id = %(run_id)s AND EXISTS (SELECT 1 FROM resumed)
), notified AS (
    SELECT pg_notify('runlane_wakeup', agent) FROM resumed
)
SELECT resumed.*, (SELECT count(*) FROM notified) AS notified FROM resumed;

-- name: request_of_run
SELECT id FROM runlane.requests WHERE run_id = %(run_id)s;

-- name: lock_run
SELECT status FROM runlane.runs WHERE id = %(run_id)s FOR UPDATE;

-- name: find_resume
SELECT * FROM runlane.runs WHERE resumed_from = %(run_id)s;

-- name: lanes_needing_dispatch
-- Lanes with queued requests that are idle, not paused, not interrupted.
-- Walks only queued requests (a partial index), so its cost grows with the
-- lanes that have work, not with every lane ever used; with plans pinned
-- to those indexes (runlane.lanes_needing_dispatch, migration 0023).
SELECT lane_id FROM runlane.lanes_needing_dispatch(%(limit)s);

-- name: expired_interrupts
-- Interrupted runs past their expiry, oldest first (runlane.expired_interrupts,
-- migration 0023: plans pinned to runs_interrupt_expiry_idx).
SELECT id, lane_id FROM runlane.expired_interrupts(%(limit)s);

-- name: expire_interrupt
-- The caller holds the run's lane lock (if it has a lane). The expiry test
-- is wrapped (IS TRUE, the same meaning) so that it does not imply the
-- predicate of runs_interrupt_expiry_idx: with statistics that saw no
-- interrupted run, PostgreSQL would find this one run by reading that
-- whole index instead of the primary key.
UPDATE runlane.runs
SET status = 'cancelled', finished_at = now(),
    error = jsonb_build_object('code', 'interrupt_expired',
                               'message', 'nobody answered the interrupt in time')
WHERE id = %(run_id)s AND status = 'interrupted' AND (interrupt_expires_at < now()) IS TRUE
  AND NOT EXISTS (SELECT 1 FROM runlane.runs AS r WHERE r.resumed_from = %(run_id)s)
RETURNING id;
