-- The listing indexes of runs begin with fixed-width hashes of the tenant
-- (and owner) instead of the text itself.
--
-- A claim and an outcome write change a run's status, so neither update can
-- be HOT: each writes a new entry in every index of runs whose predicate
-- the row meets, the listing indexes included, and those entries keep
-- landing on the leaves that hold the run's earlier versions, where
-- PostgreSQL deduplicates and deletes bottom-up, comparing neighbouring
-- entries column by column. With a text column first, no column after it
-- has a fixed offset, and each comparison walks the tuple from its start
-- (nocache_index_getattr: 5% of a backend's instructions per claimed and
-- finished run). Counted with callgrind (nineteenth session, BENCHMARKS.md
-- section 1), a backend claiming 200 runs at a time and finishing them ran
-- 9% fewer instructions per run with these keys (20% fewer when all the
-- runs shared one created_at; collating the text keys "C" there saved 1%).
--
-- A hash is not the tenant: every query through these indexes asks for
-- hashtext(tenant) = hashtext($tenant) AND tenant = $tenant (the second
-- clause checked on the row), so tenants whose names share a hash only
-- share index pages. An operator's listing of every tenant skips through
-- the distinct hashes (queries.sql, list_runs).
--
-- id DESC matches list_runs' ORDER BY created_at DESC, id DESC, as
-- runs_exceptional_listing_idx's key already did.
--
-- Old code's listings (tenant = $tenant alone) cannot use these indexes:
-- roll the API and the CLI with this migration. A plain CREATE INDEX
-- blocks writes to runs while it builds: on a large installation, apply it
-- in a quiet minute (docs/operations.md, Upgrades).
DROP INDEX runlane.runs_listing_idx;
DROP INDEX runlane.runs_owner_listing_idx;
DROP INDEX runlane.runs_exceptional_listing_idx;

CREATE INDEX runs_listing_idx ON runlane.runs (hashtext(tenant), created_at DESC, id DESC);
CREATE INDEX runs_owner_listing_idx
    ON runlane.runs (hashtext(tenant), hashtext(user_id), created_at DESC, id DESC);
CREATE INDEX runs_exceptional_listing_idx
    ON runlane.runs (hashtext(tenant), created_at DESC, id DESC)
    WHERE status IN ('failed', 'dead', 'cancelled', 'interrupted');

-- A listing asks for hashtext(tenant) = hashtext($t) AND tenant = $t;
-- the planner multiplied the two selectivities as if they were
-- independent, estimated 13 of an owner's 2,000 runs, and read and sorted
-- all of them instead of the newest few in index order.
-- These statistics (taken by ANALYZE) tell it that the hash follows from
-- the text.
CREATE STATISTICS runlane.runs_tenant_hash_stats (dependencies)
    ON tenant, hashtext(tenant) FROM runlane.runs;
CREATE STATISTICS runlane.runs_user_hash_stats (dependencies)
    ON user_id, hashtext(user_id) FROM runlane.runs;
