-- Named queries of the run queue. Each block starts with "-- name: NAME";
-- runlane.store owns them and is the only module that runs them.
-- Every time comparison uses the database's now().
--
-- Fenced writes find their run by id and lease token only. A matching
-- token means the run is leased (running or cancel_requested: the CHECK
-- runs_lease_check ties the two), so a status test would add nothing but
-- a plan risk: it lets PostgreSQL reach the row through the partial index
-- of leased runs, which it does when its statistics say few runs are
-- leased, and then it reads every leased run to find one (12-15 ms per
-- event with 20,000 runs leased, instead of a primary-key lookup;
-- tests/integration/test_query_plans.py).

-- name: insert_run
-- Inserts a run that has no idempotency key (insert_run_with_key has).
-- A run that can start now goes straight to a parked worker when there is
-- one (its standing claim, migration 0025): inserted running, with that
-- worker's lease and its attempt's start, as a claim would write them,
-- and runlane_push tells the worker. Only a run with no delay, of a
-- tenant without a cap, and with no run of its agent already waiting
-- (which the next claim must take first); else it waits pending and
-- runlane_wakeup wakes the workers.
WITH standing AS (
    SELECT * FROM runlane.take_standing_claim(
        %(tenant)s, %(agent)s, %(notify)s AND %(delay_seconds)s <= 0)
), inserted AS (
    INSERT INTO runlane.runs (id, tenant, user_id, agent, input, priority, available_at,
                              max_attempts, budget, metadata,
                              status, attempts, claim_count, lease_token, lease_expires_at,
                              worker_id, started_at, attempt_started_at, deadline_at)
    SELECT coalesce(s.run_id, gen_random_uuid()), %(tenant)s, %(user_id)s, %(agent)s,
           %(input)s, %(priority)s,
           now() + make_interval(secs => least(%(delay_seconds)s, 31536000)),
           %(max_attempts)s, %(budget)s, %(metadata)s,
           CASE WHEN s.run_id IS NULL THEN 'pending' ELSE 'running' END,
           CASE WHEN s.run_id IS NULL THEN 0 ELSE 1 END,
           CASE WHEN s.run_id IS NULL THEN 0 ELSE 1 END,
           s.lease_token,
           now() + make_interval(secs => s.lease_seconds),
           s.worker_id,
           CASE WHEN s.run_id IS NOT NULL THEN now() END,
           CASE WHEN s.run_id IS NOT NULL THEN now() END,
           CASE WHEN s.run_id IS NOT NULL THEN now() + make_interval(secs =>
               least((%(budget)s::jsonb ->> 'max_seconds')::double precision, 31536000)) END
    FROM (VALUES (1)) AS one (x) LEFT JOIN standing AS s ON true
    RETURNING *
), notified AS (
    -- A pushed run's NOTIFY carries the run as the claim answers it, so
    -- that its worker starts it without reading it first; a run too large
    -- for a NOTIFY payload (8,000 bytes) is named only, and read. Written
    -- as json text, not built as jsonb first: the payload is only ever
    -- text, and building it is on every pushed run's wake-up. The claim's
    -- columns in ClaimedRun's order, as an array (`claim`): the whole row
    -- as an object (to_json, `run`) cost 8 per cent more of PostgreSQL's
    -- instructions per pushing submit, and four times the bytes for the
    -- worker to decode (BENCHMARKS.md, section 2, thirty-sixth session). A
    -- lane's push is written alike (runlane.dispatch_head, 0046). A worker
    -- of an earlier version finds no `run` and claims the run by unparking
    -- instead.
    SELECT CASE WHEN i.lease_token IS NULL THEN pg_notify('runlane_wakeup', i.agent)
                WHEN octet_length(p.whole) <= 7900 THEN pg_notify('runlane_push', p.whole)
                ELSE pg_notify('runlane_push', json_build_object(
                    'worker_id', i.worker_id, 'run_id', i.id, 'lease_token', i.lease_token)::text)
           END
    FROM inserted AS i
    CROSS JOIN LATERAL (
        SELECT CASE WHEN i.lease_token IS NOT NULL THEN json_build_object(
            'worker_id', i.worker_id,
            'claim', json_build_array(
                i.id, i.agent, i.tenant, i.user_id, i.thread_id, i.kind, i.lane_id,
                i.input, i.attempts, i.max_attempts, i.turns, i.checkpoint, i.resume_value,
                i.metadata, i.budget, i.steer_requested_at, i.lease_token),
            'deadline_in_seconds', extract(epoch FROM i.deadline_at - now()))::text END
    ) AS p (whole)
    WHERE %(notify)s AND i.available_at <= now()
)
SELECT inserted.*, true AS created, (SELECT count(*) FROM notified) AS notified FROM inserted;

-- name: insert_run_with_key
-- Inserts a run with an idempotency key, or returns the run the key
-- already made in the tenant for the user. Such a run is never pushed to
-- a parked worker (a key's conflict drops the row, which a standing claim
-- could not give back): it waits pending and runlane_wakeup wakes the
-- workers when it is available now.
WITH inserted AS (
    INSERT INTO runlane.runs (tenant, user_id, agent, input, priority, available_at,
                              max_attempts, budget, idempotency_key, metadata)
    VALUES (%(tenant)s, %(user_id)s, %(agent)s, %(input)s, %(priority)s,
            now() + make_interval(secs => least(%(delay_seconds)s, 31536000)),
            %(max_attempts)s, %(budget)s, %(idempotency_key)s, %(metadata)s)
    ON CONFLICT (tenant, user_id, idempotency_key) WHERE idempotency_key IS NOT NULL
    DO NOTHING
    RETURNING *
), notified AS (
    SELECT pg_notify('runlane_wakeup', i.agent)
    FROM inserted AS i
    WHERE %(notify)s AND i.available_at <= now()
)
SELECT inserted.*, true AS created, (SELECT count(*) FROM notified) AS notified FROM inserted
UNION ALL
SELECT k.*, false AS created, 0 AS notified
FROM runlane.run_by_idempotency_key(%(tenant)s, %(user_id)s, %(idempotency_key)s) AS k
WHERE NOT EXISTS (SELECT 1 FROM inserted);

-- name: get_runs
SELECT r.*, q.request_id AS client_request_id
FROM runlane.runs AS r LEFT JOIN runlane.requests AS q ON q.id = r.request_id
WHERE r.id = ANY(%(run_ids)s::uuid[]);

-- name: get_run
-- With the client's request_id when the run came from a lane's request.
SELECT r.*, q.request_id AS client_request_id
FROM runlane.runs AS r LEFT JOIN runlane.requests AS q ON q.id = r.request_id
WHERE r.id = %(run_id)s;

-- name: list_runs
-- Newest first; the cursor is the (created_at, id) of the last row seen.
-- A page is read through run_listing (migration 0030) in its order, by
-- tenant or by owner, each listed run fetched by primary key and the
-- other filters checked on it. The tenant is written so that it folds to a
-- constant when it is given (COALESCE of a constant). An owner's runs
-- without a tenant: the tenants are found by skipping through
-- run_listing_tenant_idx, one descent per tenant, and the page is the
-- newest of their pages. (Read as one scan, every run ever stored was
-- read and sorted for a page: 300,020 rows for 50 runs;
-- tests/integration/test_query_plans.py.) Without a tenant or an owner
-- the listing is list_runs_of_every_tenant; of the rare statuses alone,
-- list_exceptional_runs (list_exceptional_runs_of_every_tenant without a
-- tenant).
WITH RECURSIVE tenants AS (
    SELECT coalesce(%(tenant)s::text,
                    (SELECT l.tenant FROM runlane.run_listing AS l
                     ORDER BY l.tenant LIMIT 1)) AS tenant
    UNION ALL
    SELECT (SELECT l.tenant FROM runlane.run_listing AS l
            WHERE l.tenant > t.tenant
            ORDER BY l.tenant LIMIT 1)
    FROM tenants AS t
    WHERE t.tenant IS NOT NULL AND %(tenant)s::text IS NULL
)
SELECT page.*, (SELECT q.request_id FROM runlane.requests AS q WHERE q.id = page.request_id)
           AS client_request_id
FROM tenants CROSS JOIN LATERAL (
    SELECT r.* FROM runlane.run_listing AS l JOIN runlane.runs AS r ON r.id = l.run_id
    WHERE l.tenant = coalesce(%(tenant)s::text, tenants.tenant)
      AND (%(user_id)s::text IS NULL OR l.user_id = %(user_id)s)
      AND (%(thread_id)s::text IS NULL OR r.thread_id = %(thread_id)s)
      AND (%(statuses)s::text[] IS NULL OR r.status = ANY(%(statuses)s))
      AND (%(agent)s::text IS NULL OR r.agent = %(agent)s)
      AND (%(before_created_at)s::timestamptz IS NULL
           OR (l.created_at, l.run_id) < (%(before_created_at)s, %(before_id)s::uuid))
    ORDER BY l.created_at DESC, l.run_id DESC
    LIMIT %(limit)s
) AS page
ORDER BY page.created_at DESC, page.id DESC
LIMIT %(limit)s;

-- name: list_runs_of_every_tenant
-- list_runs without a tenant or an owner (an operator's view): every
-- tenant's runs newest first, through run_listing_created_idx (migration
-- 0044), each listed run fetched by primary key and the other filters
-- checked on it. Put together from one page per tenant (list_runs), a page
-- cost a page of every tenant: 1,000 tenants, 1,000 pages. The cursor is
-- a bound of the index scan even in a generic plan (no cursor: the cursor
-- after every run), as in runlane.walk_live_runs.
SELECT r.*, (SELECT q.request_id FROM runlane.requests AS q WHERE q.id = r.request_id)
           AS client_request_id
FROM runlane.run_listing AS l JOIN runlane.runs AS r ON r.id = l.run_id
WHERE l.created_at > '-infinity'  -- run_listing_created_idx's predicate (0044)
  AND (l.created_at, l.run_id)
      < (coalesce(%(before_created_at)s::timestamptz, 'infinity'),
         coalesce(%(before_id)s::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
  AND (%(thread_id)s::text IS NULL OR r.thread_id = %(thread_id)s)
  AND (%(statuses)s::text[] IS NULL OR r.status = ANY(%(statuses)s))
  AND (%(agent)s::text IS NULL OR r.agent = %(agent)s)
ORDER BY l.created_at DESC, l.run_id DESC
LIMIT %(limit)s;

-- name: list_exceptional_runs
-- list_runs of a tenant for statuses that are all among failed, dead,
-- cancelled and interrupted (RunStore decides): read through
-- runs_exceptional_listing_idx, which holds only those runs, instead of
-- walking every run of the tenant for a few of them. The status list is
-- written out as the index's predicate, so that even a generic plan may
-- use the index. Its key begins with hashtext(tenant) (0029): a page asks
-- for the tenant's hash and checks the tenant on the row, where the
-- statistics of 0029 know that the two select the same rows.
SELECT runs.*, (SELECT q.request_id FROM runlane.requests AS q WHERE q.id = runs.request_id)
           AS client_request_id
FROM runlane.runs
WHERE hashtext(runs.tenant) = hashtext(%(tenant)s::text) AND runs.tenant = %(tenant)s
  AND status IN ('failed', 'dead', 'cancelled', 'interrupted')
  AND status = ANY(%(statuses)s::text[])
  AND (%(user_id)s::text IS NULL OR user_id = %(user_id)s)
  AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s)
  AND (%(agent)s::text IS NULL OR agent = %(agent)s)
  AND (%(before_created_at)s::timestamptz IS NULL
       OR (created_at, id) < (%(before_created_at)s, %(before_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: list_exceptional_runs_of_every_tenant
-- list_exceptional_runs without a tenant (an operator's view, maybe of
-- one owner): the distinct tenant name hashes are skipped through in
-- runs_exceptional_listing_idx itself, and a hash's runs are every tenant's
-- of that hash. Only the hashes whose newest run of the page's kind (its
-- head) is among the newest heads can hold a run of the page, so only
-- theirs are read: a page of each hash read 20,000 failed runs for 50
-- among 1,000 tenants (thirty-fourth session, BENCHMARKS.md section 4).
WITH RECURSIVE tenants AS (
    (SELECT hashtext(r.tenant) AS tenant_hash FROM runlane.runs AS r
     WHERE r.status IN ('failed', 'dead', 'cancelled', 'interrupted')
     ORDER BY hashtext(r.tenant) LIMIT 1)
    UNION ALL
    SELECT (SELECT hashtext(r.tenant) FROM runlane.runs AS r
            WHERE r.status IN ('failed', 'dead', 'cancelled', 'interrupted')
              AND hashtext(r.tenant) > t.tenant_hash
            ORDER BY hashtext(r.tenant) LIMIT 1)
    FROM tenants AS t
    WHERE t.tenant_hash IS NOT NULL
), heads AS (
    SELECT tenants.tenant_hash
    FROM tenants CROSS JOIN LATERAL (
        -- The page's conditions, below, each hash's newest run alone.
        SELECT runs.created_at, runs.id FROM runlane.runs
        WHERE hashtext(runs.tenant) = tenants.tenant_hash
          AND status IN ('failed', 'dead', 'cancelled', 'interrupted')
          AND status = ANY(%(statuses)s::text[])
          AND (%(user_id)s::text IS NULL OR user_id = %(user_id)s)
          AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s)
          AND (%(agent)s::text IS NULL OR agent = %(agent)s)
          AND (%(before_created_at)s::timestamptz IS NULL
               OR (created_at, id) < (%(before_created_at)s, %(before_id)s::uuid))
        ORDER BY created_at DESC, id DESC
        LIMIT 1
    ) AS head
    ORDER BY head.created_at DESC, head.id DESC
    LIMIT %(limit)s
)
SELECT page.*, (SELECT q.request_id FROM runlane.requests AS q WHERE q.id = page.request_id)
           AS client_request_id
FROM heads CROSS JOIN LATERAL (
    SELECT * FROM runlane.runs
    WHERE hashtext(runs.tenant) = heads.tenant_hash
      AND status IN ('failed', 'dead', 'cancelled', 'interrupted')
      AND status = ANY(%(statuses)s::text[])
      AND (%(user_id)s::text IS NULL OR user_id = %(user_id)s)
      AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s)
      AND (%(agent)s::text IS NULL OR agent = %(agent)s)
      AND (%(before_created_at)s::timestamptz IS NULL
           OR (created_at, id) < (%(before_created_at)s, %(before_id)s::uuid))
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
) AS page
ORDER BY page.created_at DESC, page.id DESC
LIMIT %(limit)s;

-- name: list_live_runs
-- list_runs for statuses that are all among pending, running and
-- cancel_requested (RunStore decides), by runlane.list_live_runs
-- (migrations 0037 and 0042): a bounded walk of each tenant's newest runs,
-- else the live runs' partial indexes, with plans kept from reading the
-- history whatever the statistics say.
SELECT page.*, (SELECT q.request_id FROM runlane.requests AS q WHERE q.id = page.request_id)
           AS client_request_id
FROM runlane.list_live_runs(%(statuses)s::text[], %(tenant)s::text, %(user_id)s::text,
                            %(thread_id)s::text, %(agent)s::text,
                            %(before_created_at)s::timestamptz, %(before_id)s::uuid,
                            %(limit)s::integer) AS page
ORDER BY page.created_at DESC, page.id DESC;

-- name: read_one_snapshot
-- A listing put together from several queries (RunStore.list_runs) reads
-- them all in one snapshot, so that a run changing status between two of
-- them is listed once, not twice or not at all.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;

-- name: claim_batch
-- Claims up to `limit` runs (of `agents`, or any agent when NULL) in one
-- short transaction: highest effective priority first (priority, aged by
-- waiting time), then available_at, then submission order; tenant caps
-- respected. See runlane.claim_runs in the migrations.
-- It answers the run's columns that a worker reads, in the order of the
-- fields of runlane.models.ClaimedRun (every column cost the worker's CPU
-- to decode, per run).
SELECT c.id, c.agent, c.tenant, c.user_id, c.thread_id, c.kind, c.lane_id, c.input,
       c.attempts, c.max_attempts, c.turns, c.checkpoint, c.resume_value, c.metadata,
       c.budget, c.steer_requested_at, c.lease_token,
       extract(epoch FROM c.deadline_at - now())::double precision AS deadline_in_seconds,
       false AS pushed
FROM runlane.claim_runs(%(worker_id)s, %(agents)s::text[], %(limit)s,
                        %(lease_seconds)s, %(aging_seconds)s) AS c
ORDER BY c.priority DESC, c.available_at, c.seq;

-- name: claim_or_park
-- claim_batch for a worker that may park or is parked: with `unpark`, its
-- standing claim is withdrawn first and the run a submit gave it comes
-- back too (by_push); with `park_seconds`, a claim that came back short
-- parks it (runlane.claim_or_park, migration 0025).
SELECT (c.claimed).id, (c.claimed).agent, (c.claimed).tenant, (c.claimed).user_id,
       (c.claimed).thread_id, (c.claimed).kind, (c.claimed).lane_id, (c.claimed).input,
       (c.claimed).attempts, (c.claimed).max_attempts, (c.claimed).turns,
       (c.claimed).checkpoint, (c.claimed).resume_value, (c.claimed).metadata,
       (c.claimed).budget, (c.claimed).steer_requested_at, (c.claimed).lease_token,
       extract(epoch FROM (c.claimed).deadline_at - now())::double precision
           AS deadline_in_seconds,
       c.by_push AS pushed
FROM runlane.claim_or_park(%(worker_id)s, %(agents)s::text[], %(limit)s,
                           %(lease_seconds)s, %(aging_seconds)s,
                           %(unpark)s, %(park_seconds)s) AS c
ORDER BY (c.claimed).priority DESC, (c.claimed).available_at, (c.claimed).seq;

-- name: unpark_worker
-- Withdraws the standing claim; answers the run a submit gave it, if any.
DELETE FROM runlane.standing_claims WHERE worker_id = %(worker_id)s
RETURNING run_id, lease_token;

-- name: get_pushed_run
-- A run a submit gave this worker's standing claim, as a claim answers it;
-- nothing once that attempt has ended or lost its lease.
SELECT r.id, r.agent, r.tenant, r.user_id, r.thread_id, r.kind, r.lane_id, r.input,
       r.attempts, r.max_attempts, r.turns, r.checkpoint, r.resume_value, r.metadata,
       r.budget, r.steer_requested_at, r.lease_token,
       extract(epoch FROM r.deadline_at - now())::double precision AS deadline_in_seconds,
       false AS pushed
FROM runlane.runs AS r
WHERE r.id = %(run_id)s AND r.lease_token = %(lease_token)s;

-- name: set_tenant_limit
INSERT INTO runlane.tenant_limits (tenant, max_running)
VALUES (%(tenant)s, %(max_running)s)
ON CONFLICT (tenant) DO UPDATE SET max_running = excluded.max_running, updated_at = now()
RETURNING tenant, max_running;

-- name: clear_tenant_limit
DELETE FROM runlane.tenant_limits WHERE tenant = %(tenant)s RETURNING tenant;

-- name: list_tenant_limits
-- Each cap with its tenant's running runs, counted through the partial
-- index of leased runs whatever the statistics say (migration 0039).
SELECT c.tenant, c.max_running, c.running FROM runlane.tenant_caps(%(tenant)s::text) AS c;

-- name: renew_leases
-- One statement per heartbeat tick for every lease a worker holds. Returns
-- one row per lease: renewed (with its status, cancel_requested saying a
-- cancel waits, and whether a steer waits), or not renewed. A lease not
-- renewed is lost unless still_held: its row was locked by someone else
-- just now (SKIP LOCKED, so one busy row never stalls all the others), and
-- the next tick tries again. An expired lease is never revived, even before
-- the reaper sees it. The ids and tokens go in binary, as in
-- finish_attempts: a worker holding 1,000 leases sends 2,000 of them.
WITH seen AS (
    -- The worker's own liveness rides on the same statement.
    INSERT INTO runlane.workers (id, hostname, pid, agents, concurrency, running)
    VALUES (%(worker_id)s, %(hostname)s, %(pid)s, %(agents)s, %(concurrency)s,
            cardinality(%(run_ids)b::uuid[]))
    ON CONFLICT (id) DO UPDATE
    SET last_seen_at = now(), running = excluded.running, agents = excluded.agents
), held AS (
    SELECT * FROM unnest(%(run_ids)b::uuid[], %(lease_tokens)b::uuid[])
        AS held(run_id, lease_token)
), lockable AS (
    SELECT r.id FROM runlane.runs AS r JOIN held ON r.id = held.run_id
    WHERE r.lease_token = held.lease_token
      AND r.lease_expires_at > now()
    FOR NO KEY UPDATE OF r SKIP LOCKED
), renewed AS (
    UPDATE runlane.runs AS r
    SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
    FROM lockable
    WHERE r.id = lockable.id
    RETURNING r.id, r.status, r.steer_requested_at IS NOT NULL AS steer_requested
)
SELECT held.run_id AS id, renewed.status, coalesce(renewed.steer_requested, false)
           AS steer_requested,
       renewed.id IS NOT NULL AS renewed,
       EXISTS (SELECT 1 FROM runlane.runs AS r
               WHERE r.id = held.run_id AND r.lease_token = held.lease_token
                 AND r.lease_expires_at > now()) AS still_held
FROM held LEFT JOIN renewed ON renewed.id = held.run_id;

-- name: finish_attempts
-- Ends a batch of attempts, each identified by (run_id, lease_token), in
-- one statement (a worker batches its completions). Fenced: a stale token
-- matches no row and changes nothing; only the rows still held come back,
-- as (id, new status): the worker decodes no row it does not use.
--   outcome completed -> run completed
--   outcome failed    -> run failed
--   outcome cancelled -> run cancelled
--   outcome retry     -> run pending after backoff (or the asked delay)
--   outcome released  -> run pending at once (worker shutdown)
--   outcome steered   -> run completed, outcome 'steered' (a steer arrived)
--   outcome interrupted -> run interrupted, waiting for a resume
-- A retry, release, steer or interrupt of a run with a cancel request ends it
-- cancelled, so a cancel is never lost; with attempts exhausted a retry
-- ends dead. For a lane's run the caller holds the lane's row lock, and the
-- runs_relay_lane trigger relays in this same transaction. The write itself
-- is runlane.finish_attempts (migration 0015), whose plans are kept pinned
-- to primary-key lookups. Every array goes in binary (the b placeholders):
-- as text, psycopg tests each element of an array against a regular
-- expression for quoting, and escapes every quote of a JSON value, 2.8 us
-- of the worker's CPU per run for the ids in a batch of 200 against 0.5
-- in binary, and 7-13 us per output against 3 (BENCHMARKS.md, section 1).
-- An array of only NULLs has no binary element type; such an array is
-- sent as one NULL (the function's unnest pads it with NULLs).
SELECT f.run_id AS id, f.run_status AS status
FROM runlane.finish_attempts(
    %(run_ids)b::uuid[], %(lease_tokens)b::uuid[], %(outcomes)b::text[],
    %(outputs)b::jsonb[], %(errors)b::jsonb[], %(retry_delays)b::double precision[],
    %(interrupts)b::jsonb[], %(interrupt_expires)b::double precision[], %(notify)s
) AS f;

-- name: lock_lanes
-- The lanes of a batch of finishing runs, locked in id order (one order for
-- every multi-lane locker, so two never deadlock), before any of their runs.
SELECT id FROM runlane.lanes WHERE id = ANY(%(lane_ids)s::bigint[]) ORDER BY id FOR UPDATE;

-- name: append_event
-- Fenced event append with a gap-free per-run seq; NULL when the lease is
-- not held. This and the next four run in functions whose plans are
-- pinned to primary-key lookups (migration 0019).
SELECT runlane.append_event(%(run_id)s, %(lease_token)s, %(kind)s, %(data)s) AS seq;

-- name: append_events
-- Fenced event appends of many runs in one statement (migration 0036):
-- one row per given event, in the order given, with its seq or NULL when
-- its lease was not held. The arrays go in binary, as in finish_attempts.
SELECT e.event_seq AS seq
FROM runlane.append_events(%(run_ids)b::uuid[], %(lease_tokens)b::uuid[],
                           %(kinds)b::text[], %(datas)b::jsonb[]) AS e
ORDER BY e.event_ord;

-- name: save_checkpoint
SELECT runlane.save_checkpoint(%(run_id)s, %(lease_token)s, %(checkpoint)s) AS saved;

-- name: count_turn
-- Fenced: one more model turn for the run; the new count, NULL when the
-- lease is not held.
SELECT runlane.count_turn(%(run_id)s, %(lease_token)s) AS turns;

-- name: get_effect
SELECT result FROM runlane.get_effect(%(run_id)s, %(key)s);

-- name: record_effect
-- Fenced: records the effect only while the lease is held (owned = 1). An
-- existing record for the same key wins (returned as `result`).
SELECT owned, result FROM runlane.record_effect(%(run_id)s, %(lease_token)s, %(key)s, %(result)s);

-- name: request_cancel
-- Durable cancel: a pending or interrupted run is cancelled at once; a
-- running one records the intent (cancel_requested) and its owner confirms.
-- Idempotent. For a lane's run the caller holds the lane lock. target locks
-- the row, so after waiting on a concurrent writer it sees the latest
-- version (a plain read would see this statement's older snapshot).
WITH target AS (
    SELECT * FROM runlane.runs WHERE id = %(run_id)s FOR UPDATE
), changed AS (
    UPDATE runlane.runs AS r
    SET status = CASE WHEN target.status = 'running' THEN 'cancel_requested'
                      ELSE 'cancelled' END,
        finished_at = CASE WHEN target.status = 'running' THEN r.finished_at ELSE now() END,
        cancel_requested_at = coalesce(r.cancel_requested_at, now())
    FROM target
    WHERE r.id = target.id
      AND target.status IN ('pending', 'running', 'interrupted')
      -- An interrupted run that was resumed is over: cancel its resume instead.
      AND NOT (target.status = 'interrupted'
               AND EXISTS (SELECT 1 FROM runlane.runs AS x WHERE x.resumed_from = target.id))
    RETURNING r.*
), notified AS (
    SELECT pg_notify('runlane_cancel', id::text) FROM changed
    WHERE %(notify)s AND status = 'cancel_requested'
)
SELECT changed.*, (SELECT count(*) FROM notified) AS notified FROM changed
UNION ALL
SELECT target.*, 0 AS notified FROM target
WHERE NOT EXISTS (SELECT 1 FROM changed);

-- name: requeue_run
-- Re-queues a failed or dead run: attempts start again, history is kept.
-- target locks the row (see request_cancel). The attempt kept on the run
-- since it ended moves to its run_attempts row in the trigger
-- runs_move_kept_attempt (migration 0051), fired by finished_at = NULL.
WITH target AS (
    SELECT * FROM runlane.runs WHERE id = %(run_id)s FOR UPDATE
), requeued AS (
    UPDATE runlane.runs AS r
    SET status = 'pending', attempts = 0, available_at = now(), finished_at = NULL,
        error = NULL, output = NULL, outcome = NULL, deadline_at = NULL,
        cancel_requested_at = NULL, steer_requested_at = NULL
    FROM target
    WHERE r.id = target.id AND target.status IN ('failed', 'dead')
    RETURNING r.*
), notified AS (
    SELECT pg_notify('runlane_wakeup', agent) FROM requeued WHERE %(notify)s
)
SELECT requeued.*, true AS requeued, (SELECT count(*) FROM notified) AS notified FROM requeued
UNION ALL
SELECT target.*, false AS requeued, 0 AS notified FROM target
WHERE NOT EXISTS (SELECT 1 FROM requeued);

-- name: reap_expired_leases
-- Expired leases: back to pending with backoff while attempts remain, else
-- dead; an expired cancel_requested becomes cancelled. Without run_id, a
-- batch of direct runs; with run_id, that one lane run, whose lane the
-- caller has locked first (lane before run, as every lane writer does).
-- The one run is found by primary key: its status test, wrapped in IS
-- TRUE, does not imply the predicate of runs_leased_idx, through which
-- statistics taken while few runs were leased made PostgreSQL read every
-- leased run to find this one. Each branch keeps its shape whatever the
-- parameters, so a plan kept for the prepared statement serves both. The
-- batch of direct runs is found by runlane.expired_direct_leases (migration
-- 0041), through runs_leased_idx whatever the statistics say; with run_id
-- it is asked for none.
WITH expired_direct AS (
    SELECT d.id, d.lease_token, d.claim_count, d.worker_id, d.attempt_started_at
    FROM runlane.expired_direct_leases(
        CASE WHEN %(run_id)s::uuid IS NULL THEN %(limit)s::integer ELSE 0 END) AS d
), expired_one AS (
    SELECT id, lease_token, claim_count, worker_id, attempt_started_at FROM runlane.runs
    WHERE id = %(run_id)s::uuid
      AND (status IN ('running', 'cancel_requested') AND lease_expires_at < now()) IS TRUE
    FOR UPDATE SKIP LOCKED
), expired AS (
    SELECT * FROM expired_direct UNION ALL SELECT * FROM expired_one
), reaped AS (
    UPDATE runlane.runs AS r
    SET status = CASE
            WHEN r.status = 'cancel_requested' THEN 'cancelled'
            WHEN r.attempts < r.max_attempts THEN 'pending'
            ELSE 'dead'
        END,
        available_at = CASE
            WHEN r.status = 'running' AND r.attempts < r.max_attempts
                THEN now() + make_interval(secs => runlane.backoff_seconds(r.attempts))
            ELSE r.available_at
        END,
        finished_at = CASE
            WHEN r.status = 'running' AND r.attempts < r.max_attempts THEN NULL
            ELSE now()
        END,
        error = CASE
            WHEN r.status = 'cancel_requested' THEN r.error
            ELSE jsonb_build_object('code', 'lease_expired',
                                    'message', 'the worker stopped renewing its lease')
        END,
        lease_token = NULL,
        lease_expires_at = NULL,
        worker_id = NULL
    FROM expired
    WHERE r.id = expired.id
    RETURNING r.id, r.status, r.agent
), attempt_rows AS (
    -- The expired attempt's row (migration 0035), from what the run held
    -- for it when it was locked above.
    INSERT INTO runlane.run_attempts (run_id, attempt, worker_id, lease_token, started_at,
                                      ended_at, outcome, error)
    SELECT expired.id, expired.claim_count, expired.worker_id, expired.lease_token,
           expired.attempt_started_at, now(), 'lease_expired',
           jsonb_build_object('code', 'lease_expired',
                              'message', 'the worker stopped renewing its lease')
    FROM reaped JOIN expired ON expired.id = reaped.id
)
SELECT id, status, agent FROM reaped;

-- name: expired_lane_leases
SELECT id, lane_id FROM runlane.runs
WHERE status IN ('running', 'cancel_requested') AND lease_expires_at < now()
  AND lane_id IS NOT NULL
ORDER BY lease_expires_at
LIMIT %(limit)s;

-- name: lock_lane
-- The lane row lock that every change to a lane (and to its runs' status)
-- takes first.
SELECT id FROM runlane.lanes WHERE id = %(lane_id)s FOR UPDATE;

-- name: lock_lane_of_run
-- A run's lane never changes, so reading lane_id unlocked is safe.
SELECT l.id, l.paused_run_id, l.interrupted_run_id FROM runlane.lanes AS l
WHERE l.id = (SELECT lane_id FROM runlane.runs WHERE id = %(run_id)s)
FOR UPDATE;

-- name: unpause_lane_for_run
UPDATE runlane.lanes
SET paused_run_id = NULL, paused_reason = NULL, updated_at = now()
WHERE id = %(lane_id)s AND paused_run_id = %(run_id)s;

-- name: worker_stopped
UPDATE runlane.workers SET stopped_at = now(), running = 0 WHERE id = %(worker_id)s;

-- name: list_workers
-- Workers seen within alive_seconds, with the runs they hold, found through
-- the partial index of leased runs whatever the statistics say
-- (runlane.worker_run_ids, migration 0043).
SELECT w.*, (w.stopped_at IS NULL AND w.last_seen_at > now() - make_interval(secs =>
                 %(alive_seconds)s)) AS alive,
       runlane.worker_run_ids(w.id) AS run_ids
FROM runlane.workers AS w
WHERE coalesce(w.stopped_at, w.last_seen_at) > now() - make_interval(secs => %(forget_seconds)s)
ORDER BY w.started_at;

-- name: prune_workers
-- Workers that stopped, or stopped heartbeating (gone), longer ago than
-- forget_seconds: list_workers no longer shows them. A gone worker's runs
-- were taken back by the reaper long before.
WITH doomed AS (
    SELECT id FROM runlane.workers
    WHERE coalesce(stopped_at, last_seen_at) < now() - make_interval(secs => %(forget_seconds)s)
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM runlane.workers AS w USING doomed WHERE w.id = doomed.id
RETURNING w.id;

-- name: prune_runs
-- One batch of finished runs older than the cutoff for their status; their
-- attempts, events and effects go with them (ON DELETE CASCADE). The
-- shortest cutoff bounds the index scan: without it, a pass with fewer
-- than a batch due read every finished run the retention keeps.
WITH doomed AS (
    SELECT r.id FROM runlane.runs AS r
    JOIN unnest(%(statuses)s::text[], %(older_than_seconds)s::double precision[])
        AS keep(status, seconds) ON keep.status = r.status
    WHERE r.status IN ('completed', 'failed', 'dead', 'cancelled')
      AND r.finished_at < now() - make_interval(secs => keep.seconds)
      AND r.finished_at < now() - make_interval(secs => (
          SELECT min(s) FROM unnest(%(older_than_seconds)s::double precision[]) AS s))
    ORDER BY r.finished_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM runlane.runs AS r WHERE r.id = ANY(ARRAY(SELECT id FROM doomed))
RETURNING r.id;

-- name: prune_requests
-- Requests that ended without a run (cancelled, rejected, failed), and
-- dispatched ones whose run was pruned, found through their partial
-- indexes whatever the statistics say (runlane.prunable_requests,
-- migration 0043, which locks them).
DELETE FROM runlane.requests AS q
WHERE q.id = ANY(ARRAY(SELECT runlane.prunable_requests(%(older_than_seconds)s, %(batch)s)))
RETURNING q.id;

-- name: queue_gauges
-- Pending and running runs by agent and tenant, read from the partial
-- indexes of live rows only: cost grows with the backlog, never with
-- history (runlane.queue_gauges, migration 0024: plans pinned to those
-- indexes).
SELECT * FROM runlane.queue_gauges(%(tenant)s);

-- name: dead_count
-- Through the partial index of dead runs whatever the statistics say
-- (runlane.dead_count, migration 0040).
SELECT runlane.dead_count(%(tenant)s::text) AS count;

-- name: waiting_lanes
-- Paused or interrupted lanes, with their queued requests, oldest change
-- first (runlane.waiting_lanes, migration 0024: lanes_waiting_idx).
SELECT * FROM runlane.waiting_lanes(%(tenant)s, %(limit)s);

-- name: list_events
SELECT run_id, seq, kind, data, attempt, created_at FROM runlane.run_events
WHERE run_id = %(run_id)s AND seq > %(after_seq)s
ORDER BY seq
LIMIT %(limit)s;

-- name: list_attempts
-- The run's attempts in order, through the view that finds each where it
-- is kept: ended attempts in run_attempts, the last ended one and the one
-- in progress on the run (migrations 0035, 0050 and 0051).
SELECT run_id, attempt, worker_id, lease_token, started_at, ended_at, outcome, error
FROM runlane.attempts WHERE run_id = %(run_id)s
ORDER BY attempt;

-- name: count_runs_by_status
-- A tenant's runs through its listing (migration 0030).
SELECT r.status, count(*) AS count
FROM runlane.run_listing AS l JOIN runlane.runs AS r ON r.id = l.run_id
WHERE %(tenant)s::text IS NULL OR l.tenant = %(tenant)s
GROUP BY r.status;
