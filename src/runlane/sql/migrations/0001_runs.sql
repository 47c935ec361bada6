-- The run queue: runs, their attempts (one row per claim), their events and
-- their recorded effects.

CREATE TABLE runlane.runs (
    id               uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    -- Submission order: the tie-breaker after priority and available_at.
    seq              bigint      GENERATED ALWAYS AS IDENTITY,
    tenant           text        NOT NULL DEFAULT 'default',
    -- Lane scope: NULL for a direct run. The lanes layer fills these.
    thread_id        text,
    agent            text        NOT NULL,
    status           text        NOT NULL DEFAULT 'pending',
    input            jsonb       NOT NULL,
    output           jsonb,
    error            jsonb,
    priority         integer     NOT NULL DEFAULT 0,
    available_at     timestamptz NOT NULL DEFAULT now(),
    -- Attempts in the current cycle: grows at claim, reset by a re-queue.
    attempts         integer     NOT NULL DEFAULT 0,
    -- Claims over the run's whole life: numbers its attempts rows.
    claim_count      integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL,
    budget           jsonb       NOT NULL DEFAULT '{}',
    deadline_at      timestamptz,
    idempotency_key  text,
    metadata         jsonb       NOT NULL DEFAULT '{}',
    checkpoint       jsonb,
    -- The current attempt's lease. Heartbeats only touch lease_expires_at,
    -- which no index covers, so renewals can be HOT updates.
    lease_token      uuid,
    lease_expires_at timestamptz,
    worker_id        text,
    last_event_seq   bigint      NOT NULL DEFAULT 0,
    cancel_requested_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    CONSTRAINT runs_status_check CHECK (status IN (
        'pending', 'running', 'cancel_requested', 'completed', 'failed',
        'dead', 'cancelled', 'interrupted')),
    CONSTRAINT runs_attempts_check CHECK (attempts >= 0 AND attempts <= max_attempts),
    CONSTRAINT runs_max_attempts_check CHECK (max_attempts >= 1),
    CONSTRAINT runs_lease_check CHECK (
        (status IN ('running', 'cancel_requested')) = (lease_token IS NOT NULL))
) WITH (fillfactor = 80);

-- Claiming reads only pending rows, in claim order.
CREATE INDEX runs_claim_idx ON runlane.runs (priority DESC, available_at, seq)
    WHERE status = 'pending';

-- Lease sweeps and heartbeats read only leased rows. lease_expires_at is
-- deliberately not indexed (see above); the leased set is small.
CREATE INDEX runs_leased_idx ON runlane.runs (worker_id)
    WHERE status IN ('running', 'cancel_requested');

CREATE UNIQUE INDEX runs_idempotency_key_idx ON runlane.runs (tenant, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE INDEX runs_listing_idx ON runlane.runs (tenant, created_at DESC, id);

CREATE TABLE runlane.run_attempts (
    run_id      uuid        NOT NULL REFERENCES runlane.runs (id) ON DELETE CASCADE,
    -- 1, 2, 3... over the run's life (runs.claim_count at the claim).
    attempt     integer     NOT NULL,
    worker_id   text        NOT NULL,
    lease_token uuid        NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    ended_at    timestamptz,
    outcome     text,
    error       jsonb,
    PRIMARY KEY (run_id, attempt),
    UNIQUE (lease_token)
);

CREATE TABLE runlane.run_events (
    run_id     uuid        NOT NULL REFERENCES runlane.runs (id) ON DELETE CASCADE,
    seq        bigint      NOT NULL,
    kind       text        NOT NULL,
    data       jsonb       NOT NULL DEFAULT '{}',
    attempt    integer,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE runlane.run_effects (
    run_id     uuid        NOT NULL REFERENCES runlane.runs (id) ON DELETE CASCADE,
    key        text        NOT NULL,
    result     jsonb,
    attempt    integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, key)
);

-- Retry backoff in seconds after the given number of attempts:
-- min(300, 5 * 2^(attempts - 1)) with +/-10% jitter.
CREATE FUNCTION runlane.backoff_seconds(attempts integer) RETURNS double precision
LANGUAGE sql VOLATILE AS $$
    SELECT least(300.0, 5.0 * power(2.0, greatest(attempts - 1, 0)))
           * (0.9 + 0.2 * random())
$$;
