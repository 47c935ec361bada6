-- A run's idempotency key is the submitting user's, not the whole tenant's:
-- another user's retry must never return (and so reveal) someone's run.
DROP INDEX runlane.runs_idempotency_key_idx;
CREATE UNIQUE INDEX runs_idempotency_key_idx ON runlane.runs (tenant, user_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
