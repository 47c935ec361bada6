-- Standing claims: an idle worker's claim that waits in the database, so
-- that a submit hands it the new run in the submit's own transaction.
--
-- A worker that pulls wakes on the submit's NOTIFY and then claims: two
-- commits and a round trip between them on the path of every wake-up
-- (bench/peers/sql_floor.py measures that floor, bench/peers/
-- sql_push_floor.py the one below). A worker whose claim found nothing
-- parks instead: one row here, "my next run, for these agents, with this
-- lease". A submit that can run at once takes a parked worker's row (FOR
-- UPDATE SKIP LOCKED), inserts the run already claimed by that worker
-- (running, its lease and its first attempt row, exactly what a claim
-- writes) and sends it on runlane_push to that worker, which starts it
-- without a claim of its own (insert_run in queries.sql).
--
-- The row is the worker's reservation of one slot. The submit does not
-- delete it but writes the run's id into it, so that a worker whose
-- notification was lost finds the run when it next unparks (every claim
-- of a parked worker unparks first, and an idle worker claims every poll
-- interval: DESIGN.md 3.9 holds). A worker that dies parked leaves a row
-- that stops taking runs at expires_at (a few poll intervals: the worker
-- parks again at each poll); a run pushed to it before that is a claimed
-- run of a dead worker, which the reaper recovers when its lease expires.
--
-- Unlogged: losing the rows in a crash loses nothing but the shortcut
-- (workers park again at their next poll), and a transaction that writes
-- only unlogged rows commits without waiting for a WAL flush, so parking
-- and unparking cost an idle worker no disk write.
CREATE UNLOGGED TABLE runlane.standing_claims (
    worker_id     text             PRIMARY KEY,
    -- The agents the worker serves; NULL: any agent.
    agents        text[],
    lease_seconds double precision NOT NULL CHECK (lease_seconds > 0),
    expires_at    timestamptz      NOT NULL,
    -- The run a submit gave this claim; NULL while it waits.
    run_id        uuid,
    lease_token   uuid
);

-- A worker's claim, with its standing claim: unpark first (p_unpark),
-- answering the run a submit gave the standing claim, if any (by_push);
-- then claim up to p_limit runs, one more when no submit took the
-- standing claim (its slot is free again); then, with p_park_seconds,
-- park again if the claim came back short (the queue is drained and a
-- slot is free). One round trip: an idle worker unparks, claims and parks
-- again at each poll, and a busy one never parks (its claims come back
-- full). Rows of workers that died parked go when a minute past expiry.
CREATE FUNCTION runlane.claim_or_park(
    p_worker_id text,
    p_agents text[],
    p_limit integer,
    p_lease_seconds double precision,
    p_aging_seconds double precision,
    p_unpark boolean,
    p_park_seconds double precision
) RETURNS TABLE (claimed runlane.runs, by_push boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_run_id uuid;
    v_lease_token uuid;
    v_limit integer := p_limit;
    v_claimed integer := 0;
BEGIN
    IF p_unpark THEN
        DELETE FROM runlane.standing_claims AS s WHERE s.worker_id = p_worker_id
        RETURNING s.run_id, s.lease_token INTO v_run_id, v_lease_token;
        IF v_run_id IS NOT NULL THEN
            -- A statement of its own, so a snapshot of its own: it sees the
            -- submit that filled the claim (committed before the DELETE
            -- could take the row).
            RETURN QUERY SELECT r, true FROM runlane.runs AS r
            WHERE r.id = v_run_id AND r.lease_token = v_lease_token;
        ELSE
            -- The slot the worker held for a push is free again.
            v_limit := v_limit + 1;
        END IF;
    END IF;
    IF v_limit > 0 AND (p_agents IS NULL OR cardinality(p_agents) > 0) THEN
        RETURN QUERY SELECT c, false FROM runlane.claim_runs(
            p_worker_id, p_agents, v_limit, p_lease_seconds, p_aging_seconds) AS c;
        GET DIAGNOSTICS v_claimed = ROW_COUNT;
    END IF;
    IF p_park_seconds IS NOT NULL AND v_claimed < v_limit THEN
        DELETE FROM runlane.standing_claims AS s
        WHERE s.expires_at < now() - interval '1 minute' AND s.worker_id <> p_worker_id;
        INSERT INTO runlane.standing_claims AS s (worker_id, agents, lease_seconds, expires_at)
        VALUES (p_worker_id, p_agents, p_lease_seconds,
                now() + make_interval(secs => p_park_seconds))
        ON CONFLICT (worker_id) DO UPDATE
        SET agents = excluded.agents, lease_seconds = excluded.lease_seconds,
            expires_at = excluded.expires_at, run_id = NULL, lease_token = NULL;
    END IF;
END;
$$;

-- A submit's part (insert_run): the standing claim that takes the new run,
-- if a run of p_agent for p_tenant may go to one now (p_may_push: it is
-- available now and has no idempotency key). Nothing when no worker is
-- parked for the agent, when the tenant has a cap (a claim counts it),
-- or when a run of the agent is already waiting (the next claim takes it
-- first). The parked worker's row is taken with SKIP LOCKED: a submit
-- never waits for another. In a function so that its plans keep to the
-- indexes, as the claim's do (0012): a plan kept for a connection and
-- made while runs held a few rows read every run to look for one waiting.
CREATE FUNCTION runlane.take_standing_claim(p_tenant text, p_agent text, p_may_push boolean)
RETURNS TABLE (worker_id text, run_id uuid, lease_token uuid, lease_seconds double precision)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
BEGIN
    IF NOT p_may_push
       OR NOT EXISTS (SELECT FROM runlane.standing_claims AS c
                      WHERE c.run_id IS NULL AND c.expires_at > now())
       OR EXISTS (SELECT FROM runlane.tenant_limits AS l WHERE l.tenant = p_tenant)
       OR EXISTS (SELECT FROM runlane.runs AS r
                  WHERE r.status = 'pending' AND r.agent = p_agent
                    AND r.available_at <= now()) THEN
        RETURN;
    END IF;
    RETURN QUERY
    UPDATE runlane.standing_claims AS s
    SET run_id = gen_random_uuid(), lease_token = gen_random_uuid()
    WHERE s.worker_id = (
        SELECT c.worker_id FROM runlane.standing_claims AS c
        WHERE c.run_id IS NULL AND c.expires_at > now()
          AND (c.agents IS NULL OR p_agent = ANY (c.agents))
        LIMIT 1
        FOR UPDATE SKIP LOCKED)
    RETURNING s.worker_id, s.run_id, s.lease_token, s.lease_seconds;
END;
$$;

-- The run an idempotency key already made (insert_run's second branch,
-- which runs when the key repeats). Its plan is pinned to the key's
-- unique index: in insert_run itself, a plan kept for a connection and
-- made while runs held a few rows read every run to find the one.
CREATE FUNCTION runlane.run_by_idempotency_key(p_tenant text, p_user_id text, p_key text)
RETURNS SETOF runlane.runs
LANGUAGE sql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
    SELECT * FROM runlane.runs
    WHERE tenant = p_tenant AND user_id = p_user_id AND idempotency_key = p_key;
$$;
