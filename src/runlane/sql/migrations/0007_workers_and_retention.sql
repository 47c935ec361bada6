-- Workers alive, and retention of finished runs.

CREATE TABLE runlane.workers (
    id           text        PRIMARY KEY,
    hostname     text        NOT NULL,
    pid          integer     NOT NULL,
    agents       text[],
    concurrency  integer     NOT NULL,
    running      integer     NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    stopped_at   timestamptz
) WITH (fillfactor = 70);

-- The pruner deletes finished runs oldest first, in small batches.
CREATE INDEX runs_finished_idx ON runlane.runs (finished_at)
    WHERE status IN ('completed', 'failed', 'dead', 'cancelled');

CREATE INDEX requests_ended_idx ON runlane.requests (ended_at)
    WHERE status IN ('cancelled', 'rejected', 'failed');
CREATE INDEX requests_orphaned_idx ON runlane.requests (dispatched_at)
    WHERE status = 'dispatched' AND run_id IS NULL;

-- Cheap operator gauges: dead runs, and lanes that wait for someone.
CREATE INDEX runs_dead_idx ON runlane.runs (agent) WHERE status = 'dead';
CREATE INDEX lanes_waiting_idx ON runlane.lanes (tenant)
    WHERE paused_run_id IS NOT NULL OR interrupted_run_id IS NOT NULL;
