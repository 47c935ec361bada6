-- The listings of runs (a tenant's, an owner's) are read through a table of
-- their own, runlane.run_listing, written once when a run is inserted,
-- instead of through indexes on runs.
--
-- A claim and an outcome write change a run's status, so neither can be a
-- HOT update: each writes a new entry in every index of runs whose
-- predicate the new row version meets. The two listing indexes were the
-- only such indexes that a run meets whatever its state, so they took
-- four of the eight index entries that a claimed and finished run wrote.
-- The tenant, the owner and the creation time of a run never change: their
-- listing entries need writing once, at the insert. Counted with callgrind
-- (twentieth session, BENCHMARKS.md section 1), a backend claiming 200
-- runs at a time and finishing them ran 12-13% fewer instructions per
-- run. The insert does more instead: with the runs inserted in the same
-- loop, 200 to a statement, 3% fewer in all; one to a statement, as the
-- API submits them, 0.3-0.5% more. The work moves from the claim and the
-- outcome write, under a lease, to the submit.
--
-- The keys are the names again (0029 used their hashes): these entries
-- are written once, not again at every change of the run, which is where
-- text keys cost (0029's comment). They are collated "C", so that placing
-- an entry compares bytes, not the database's locale's rules; a listing
-- only asks for equal names, and the skip through the tenants needs some
-- order, not a particular one.
--
-- The rows are written by a trigger, so that no path that inserts runs
-- (a submit, a lane's dispatch, a resume, an operator's INSERT) can leave
-- a run out of the listings; and deleted by one, with the runs they list.
--
-- The primary key finds a run's row from the run: a listing of the
-- live statuses may be read from runs' partial indexes of pending and
-- leased runs, each checked against its tenant here (and the pruner's
-- deletes find their rows). Joined by run id alone, the planner counts the
-- join's rows right; joined by id and created_at as well (to probe
-- run_listing_tenant_idx), it multiplied the two clauses' selectivities as
-- if independent, expected one row, and sorted a tenant's whole history
-- for a page (tests/integration/test_query_plans.py).
--
-- Listings of the rare statuses still read runs_exceptional_listing_idx
-- (0021, 0029) on runs: a run enters it only when it fails, dies, is
-- cancelled or interrupted.
CREATE TABLE runlane.run_listing (
    tenant     text        COLLATE "C" NOT NULL,
    user_id    text        COLLATE "C" NOT NULL,
    created_at timestamptz NOT NULL,
    run_id     uuid        PRIMARY KEY
);

INSERT INTO runlane.run_listing (tenant, user_id, created_at, run_id)
SELECT tenant, user_id, created_at, id FROM runlane.runs;

CREATE INDEX run_listing_tenant_idx
    ON runlane.run_listing (tenant, created_at DESC, run_id DESC);
CREATE INDEX run_listing_owner_idx
    ON runlane.run_listing (tenant, user_id, created_at DESC, run_id DESC);

CREATE FUNCTION runlane.list_inserted_runs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO runlane.run_listing (tenant, user_id, created_at, run_id)
    SELECT n.tenant, n.user_id, n.created_at, n.id FROM inserted_runs AS n;
    RETURN NULL;
END;
$$;

CREATE TRIGGER runs_list_inserted
    AFTER INSERT ON runlane.runs
    REFERENCING NEW TABLE AS inserted_runs
    FOR EACH STATEMENT EXECUTE FUNCTION runlane.list_inserted_runs();

-- The pruner deletes runs in batches; their listing rows are found through
-- run_listing's primary key, whatever the statistics say.
CREATE FUNCTION runlane.unlist_deleted_runs() RETURNS trigger
LANGUAGE plpgsql
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET jit = off
AS $$
BEGIN
    DELETE FROM runlane.run_listing AS l USING deleted_runs AS d
    WHERE l.run_id = d.id;
    RETURN NULL;
END;
$$;

CREATE TRIGGER runs_unlist_deleted
    AFTER DELETE ON runlane.runs
    REFERENCING OLD TABLE AS deleted_runs
    FOR EACH STATEMENT EXECUTE FUNCTION runlane.unlist_deleted_runs();

-- TRUNCATE fires no DELETE trigger; a TRUNCATE of runs takes their
-- listing with them (the test suites' fixtures truncate).
CREATE FUNCTION runlane.unlist_truncated_runs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE runlane.run_listing;
    RETURN NULL;
END;
$$;

CREATE TRIGGER runs_unlist_truncated
    AFTER TRUNCATE ON runlane.runs
    FOR EACH STATEMENT EXECUTE FUNCTION runlane.unlist_truncated_runs();

-- The listing copies a run's tenant, owner and creation time, which no
-- statement of runlane's changes; one that tried would leave the run
-- listed under the old ones, so it is refused. The trigger fires only for
-- an UPDATE that names one of these columns: never for a claim or an
-- outcome write.
CREATE FUNCTION runlane.refuse_relisting() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (NEW.tenant, NEW.user_id, NEW.created_at) IS DISTINCT FROM
       (OLD.tenant, OLD.user_id, OLD.created_at) THEN
        RAISE EXCEPTION 'a run''s tenant, user_id and created_at do not change'
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER runs_refuse_relisting
    BEFORE UPDATE OF tenant, user_id, created_at ON runlane.runs
    FOR EACH ROW EXECUTE FUNCTION runlane.refuse_relisting();

DROP INDEX runlane.runs_listing_idx;
DROP INDEX runlane.runs_owner_listing_idx;
-- The owner is now checked on run_listing; the tenant's statistics stay
-- for the exceptional listing (hashtext(tenant) and tenant on runs).
DROP STATISTICS runlane.runs_user_hash_stats;
